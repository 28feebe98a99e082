"""celery_durable: durable workflows for teams that already run Celery."""
