"""``fulfil_order``: reserve → charge → (pre-orders: wait for the release date) → pack (in
parallel) → ship → notify, as a saga.

The function is replayed from the top each time a step completes, so it must be
deterministic: side effects live in activities, and time comes from ``wf.now()``. When a step
fails for good (Celery's retries exhausted, or a non-retryable error) the workflow undoes what
it already did, newest first, and returns a *cancelled* :class:`Shipment` instead of raising:
a cancelled order is a business outcome, not a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from celery_durable import ActivityError
from celery_durable import workflow as wf
from example_project.activities import (
    charge_card,
    pack_item,
    refund,
    release_stock,
    reserve_stock,
    send_confirmation,
    ship,
)
from example_project.app import durable
from example_project.models import Failure, Order, Parcel, Shipment, ShipmentStatus

__all__ = ["fulfil_order"]


@durable.workflow(name="example.fulfil_order")
def fulfil_order(order: Order) -> Shipment:
    promised_by = wf.now() + timedelta(days=2)
    compensations: list[Callable[[], str]] = []
    receipt = None
    try:
        reservation = reserve_stock(order)
        compensations.append(lambda: release_stock(reservation))

        receipt = charge_card(order.id, order.card_token, order.total, order.currency)
        compensations.append(lambda: refund(receipt))

        if order.release_at is not None:
            # a pre-order: a durable timer, stored with the execution; no worker waits on it
            # (one longer than durable_timer_fast_path_max is fired by beat's clock scan)
            wf.sleep_until(order.release_at)

        # fan out / fan in: one task per line item, spread over the workers
        parcels: list[Parcel] = wf.gather(pack_item.s(order.id, item) for item in order.items)

        tracking = ship(order, parcels)
    except ActivityError as exc:
        undone = [undo() for undo in reversed(compensations)]
        shipment = Shipment(
            order_id=order.id,
            status=ShipmentStatus.CANCELLED,
            receipt=receipt,
            failure=Failure(
                step=exc.activity.rsplit(".", 1)[-1],
                error_type=exc.type_name,
                message=exc.message,
                attempts=exc.attempts,
            ),
            compensations=undone,
        )
    else:
        shipment = Shipment(
            order_id=order.id,
            status=ShipmentStatus.SHIPPED,
            tracking_number=tracking,
            parcels=parcels,
            receipt=receipt,
            promised_by=promised_by,
        )
    send_confirmation(order, shipment)
    return shipment
