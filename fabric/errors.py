"""The user-facing error types. The CLI turns any FabriclabError into a message and exit code 2."""
from __future__ import annotations


class FabriclabError(Exception):
    """Base of every error a user can act on (bad input, unsupported option, failed bring-up)."""


class TopologyError(FabriclabError):
    """A topology file or builder call describes an invalid fabric; the message names the item."""


class UnsupportedError(FabriclabError):
    """An option this machine or this version cannot honour (e.g. link delay without netem)."""


class EmulationError(FabriclabError):
    """Bringing up, checking or tearing down the emulated fabric failed."""


class RoutingError(FabriclabError):
    """A routing mode, policy or move that cannot be honoured; the message names it."""


class DeadlineError(FabriclabError):
    """Something polled for did not happen before its deadline; the message says what."""
