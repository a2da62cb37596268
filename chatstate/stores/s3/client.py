"""The S3 client seam (``_s3io``) as a public face for other layers, e.g. batch outputs.

``S3IO`` gets, puts (create-only with ``create=True``: ``Exists`` when the key
is taken), lists and deletes objects under one ``s3://bucket/prefix`` target,
and translates every client error into a chatstate error in one place.
"""

from __future__ import annotations

from chatstate.stores.s3._transport import S3IO, Exists, S3Target, parse_url

__all__ = ["S3IO", "Exists", "S3Target", "parse_url"]
