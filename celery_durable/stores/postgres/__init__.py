"""The PostgreSQL store (``store``) and its URL, connection pool and error translation
(``connection``).
"""
