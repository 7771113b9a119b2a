"""The one MetaData every table of the recorder's schema is defined in, and the sizes
their columns share."""

from __future__ import annotations

from sqlalchemy import MetaData

metadata = MetaData()

UID = 64
NAME = 253  # a DNS subdomain, the longest Kubernetes object name
