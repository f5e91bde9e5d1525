"""Accounts: each API key is an account, and everything a request creates belongs to its key's account.

A session, a training client, a sampling session, a checkpoint (``tinker://`` path) and a request's future
belong to the account of the key that created them. A request of another account that names one of them is
answered as if it did not exist (404): a second key can neither use, sample from, load, list nor delete the
first key's work, and cannot tell whether it exists. The account is a hash of the key (``account_of_key``), so the
key itself is never written anywhere; checkpoints record their account in their training client's
``model.json`` and keep it across a restart of the service. Two servers given the same key share nothing but
what is on disk.
"""

from __future__ import annotations

import hashlib

ACCOUNT_DIGEST_CHARS = 16


def account_of_key(api_key: str) -> str:
    """The account of ``api_key``: ``acct-`` and the first 16 hex digits of its SHA-256."""
    return "acct-" + hashlib.sha256(api_key.encode()).hexdigest()[:ACCOUNT_DIGEST_CHARS]
