"""Payloads and results (pydantic): they cross process boundaries as JSON and come back typed."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from enum import StrEnum

from pydantic import BaseModel, Field


class ShipmentStatus(StrEnum):
    SHIPPED = "shipped"
    CANCELLED = "cancelled"


class LineItem(BaseModel):
    sku: str
    qty: int = Field(gt=0)
    unit_price: Decimal = Field(gt=0, decimal_places=2)

    @property
    def total(self) -> Decimal:
        return self.unit_price * self.qty


class Order(BaseModel):
    id: str
    customer_email: str
    #: a payment-gateway test token; ``tok_flaky``, ``tok_gateway_down`` and ``tok_declined``
    #: make the simulated gateway misbehave (see :func:`example_project.activities.charge_card`)
    card_token: str = "tok_visa"
    address: str
    items: list[LineItem] = Field(min_length=1)
    currency: str = "EUR"
    placed_at: datetime
    #: a pre-order: packing waits for this release date on a durable timer
    release_at: datetime | None = None

    @property
    def total(self) -> Decimal:
        return sum((item.total for item in self.items), Decimal("0.00"))


class Reservation(BaseModel):
    id: str
    order_id: str
    skus: dict[str, int]


class Receipt(BaseModel):
    charge_id: str
    order_id: str
    amount: Decimal
    currency: str
    #: how many gateway calls this charge took (Celery retries + 1)
    attempts: int
    charged_at: datetime


class Parcel(BaseModel):
    sku: str
    qty: int
    weight_kg: Decimal
    #: the Celery worker that packed it (the fan-out spreads over workers)
    packed_by: str


class Failure(BaseModel):
    """The step that failed for good (from :class:`celery_durable.ActivityError`)."""

    step: str
    error_type: str
    message: str
    attempts: int


class Shipment(BaseModel):
    """What ``fulfil_order`` returns, shipped or not."""

    order_id: str
    status: ShipmentStatus
    tracking_number: str | None = None
    parcels: list[Parcel] = []
    receipt: Receipt | None = None
    promised_by: datetime | None = None
    #: why the order was cancelled, and what was undone (newest first)
    failure: Failure | None = None
    compensations: list[str] = []

    @property
    def reason(self) -> str | None:
        f = self.failure
        return None if f is None else f"{f.step} failed after {f.attempts} attempt(s): {f.error_type}: {f.message}"
