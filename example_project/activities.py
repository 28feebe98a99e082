"""Activities: ordinary Celery tasks (``@durable_activity``) that do the side effects.

Inside a workflow each call is a durable step: it runs once, on any worker, and its result is
replayed afterwards. Retries are Celery's own (``autoretry_for``, ``max_retries`` …); only
when they are exhausted does the workflow see an :class:`~celery_durable.ActivityError`.

The outside world is simulated, deterministically, so the demo shows every path each run:
the card token ``tok_flaky`` makes the gateway time out once, ``tok_gateway_down`` on every
attempt, ``tok_declined`` declines the card, and an address containing ``nowhere`` is rejected by
the carrier. An order with a crash request (see :func:`_crash_here`) takes its worker down.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from celery import current_task

from celery_durable import NonRetryableError, durable_activity
from example_project.app import RUN_DIR
from example_project.models import LineItem, Order, Parcel, Receipt, Reservation, Shipment

log = logging.getLogger(__name__)

#: ``retry_backoff=True`` is the production choice; the fixed short delay keeps the demo fast
RETRY: dict[str, Any] = {"max_retries": 3, "default_retry_delay": 0.3}


class PaymentGatewayError(ConnectionError):
    """The gateway timed out or answered 5xx: transient, Celery retries it."""


class CardDeclined(NonRetryableError):
    """The issuer declined the card: retrying cannot help, so Celery's autoretry is skipped."""


class AddressRejected(NonRetryableError):
    """The carrier cannot deliver to the address."""


class CarrierUnavailable(ConnectionError):
    """The carrier's API is down: transient."""


def _attempt() -> int:
    """1 on the first delivery of the running task, 2 on its first retry, …"""
    request = current_task.request if current_task else None
    return int(getattr(request, "retries", 0) or 0) + 1


@durable_activity
def reserve_stock(order: Order) -> Reservation:
    """Hold the ordered quantities in the warehouse."""
    skus: dict[str, int] = {}
    for item in order.items:
        skus[item.sku] = skus.get(item.sku, 0) + item.qty
    log.info("reserved %s for %s", skus, order.id)
    return Reservation(id=f"res-{order.id}", order_id=order.id, skus=skus)


@durable_activity
def release_stock(reservation: Reservation) -> str:
    """Compensation of :func:`reserve_stock`."""
    log.info("released reservation %s", reservation.id)
    return f"released {reservation.id}"


@durable_activity(autoretry_for=(PaymentGatewayError,), **RETRY)
def charge_card(order_id: str, card_token: str, amount: Decimal, currency: str) -> Receipt:
    """Charge the card (idempotency key = order id, as a real gateway call would use)."""
    attempt = _attempt()
    if card_token == "tok_gateway_down" or (card_token == "tok_flaky" and attempt == 1):
        raise PaymentGatewayError(f"gateway timeout charging {order_id} (attempt {attempt})")
    if card_token == "tok_declined":
        raise CardDeclined(f"card for {order_id} declined: insufficient funds")
    charge_id = "ch_" + hashlib.sha256(order_id.encode()).hexdigest()[:12]
    log.info("charged %s %s for %s on attempt %d", amount, currency, order_id, attempt)
    return Receipt(
        charge_id=charge_id,
        order_id=order_id,
        amount=amount,
        currency=currency,
        attempts=attempt,
        charged_at=datetime.now(tz=UTC),
    )


@durable_activity(autoretry_for=(PaymentGatewayError,), **RETRY)
def refund(receipt: Receipt) -> str:
    """Compensation of :func:`charge_card`."""
    log.info("refunded %s %s (%s)", receipt.amount, receipt.currency, receipt.charge_id)
    return f"refunded {receipt.amount} {receipt.currency}"


@durable_activity
def pack_item(order_id: str, item: LineItem) -> Parcel:
    """Pick and pack one line item (the workflow fans these out)."""
    request = current_task.request if current_task else None
    worker = str(getattr(request, "hostname", None) or "local").split("@")[0]
    _crash_here(order_id, worker)
    time.sleep(0.05 * item.qty)  # a little work, so the parallelism is real
    return Parcel(sku=item.sku, qty=item.qty, weight_kg=Decimal("0.25") * item.qty, packed_by=worker)


def _crash_here(order_id: str, worker: str) -> None:
    """The demo's crash: when ``python -m example_project`` asked for one for this order
    (``$EXAMPLE_RUN_DIR/crash/<order>``), the first packer to get here says so and hangs until the
    demo SIGKILLs its whole worker. The step's lease lapses, beat's recovery re-sends it, and the
    packer that runs it then finds the crash already taken and packs."""
    request = RUN_DIR / "crash" / order_id
    if not request.exists():
        return
    try:
        fd = os.open(f"{request}.taken", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # the crash happened: this is the re-sent step
    os.write(fd, worker.encode())
    os.close(fd)
    log.warning("%s: packing %s, waiting to be killed", worker, order_id)
    time.sleep(120)


@durable_activity(autoretry_for=(CarrierUnavailable,), **RETRY)
def ship(order: Order, parcels: list[Parcel]) -> str:
    """Book the carrier; return the tracking number."""
    if "nowhere" in order.address.lower():
        raise AddressRejected(f"carrier cannot deliver to {order.address!r}")
    tracking = "TRK" + uuid.uuid4().hex[:10].upper()
    log.info("shipped %d parcel(s) of %s: %s", len(parcels), order.id, tracking)
    return tracking


@durable_activity
def send_confirmation(order: Order, shipment: Shipment) -> str:
    """'Send' the customer e-mail: written to ``$EXAMPLE_RUN_DIR/outbox``."""
    outbox = RUN_DIR / "outbox"
    outbox.mkdir(parents=True, exist_ok=True)
    if shipment.status == "shipped":
        body = f"Your order {order.id} is on its way: {shipment.tracking_number}."
    else:
        body = f"Sorry, we could not fulfil order {order.id}: {shipment.reason}"
    path = outbox / f"{order.id}.txt"
    path.write_text(f"To: {order.customer_email}\n\n{body}\n")
    return str(path)
