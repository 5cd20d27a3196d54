"""The os-ken shim: extract primitives from events, call the core, send what it returns.

Configured before os-ken instantiates it (`configure()`), because os-ken 4 creates apps itself.
An unhandled exception in a handler ends the whole controller process loudly (exit code 70):
a controller running half-broken is worse than one that is visibly down.
"""
from __future__ import annotations

import functools
import logging
import os
import time
import traceback
from typing import Any, Callable

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.ofproto import ofproto_v1_3

from controller import ofmsg
from controller.core import ControllerCore

LOG = logging.getLogger("fabriclab.controller")
_CORE: ControllerCore | None = None


def configure(core: ControllerCore) -> None:
    global _CORE
    _CORE = core


def kill_on_exception(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - deliberately fatal
            LOG.critical("unhandled exception in %s, stopping the controller:\n%s", fn.__name__, traceback.format_exc())
            logging.shutdown()
            os._exit(70)

    return wrapper


class FabricController(app_manager.OSKenApp):  # type: ignore[misc]
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if _CORE is None:
            raise RuntimeError("controller.app.configure() was not called before starting os-ken")
        self.core = _CORE
        self.synced: dict[int, float] = {}

    def _send(self, dp: Any, msgs: list[Any]) -> None:
        for msg in msgs:
            msg.datapath = dp
            dp.send_msg(msg)

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    @kill_on_exception
    def switch_features_handler(self, ev: Any) -> None:
        dp = ev.msg.datapath
        name = self.core.switch_name(dp.id)
        if name is None:
            LOG.error("datapath %016x is not in fabric %r; leaving it alone", dp.id, self.core.fabric.name)
            return
        intents = self.core.on_switch_connect(dp.id)
        self._send(dp, [ofmsg.flow_mod(i) for i in intents] + [ofmsg.barrier()])
        LOG.info("switch %s (dpid %016x): %d flows sent", name, dp.id, len(intents))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    @kill_on_exception
    def barrier_reply_handler(self, ev: Any) -> None:
        dp = ev.msg.datapath
        self.synced[dp.id] = time.time()
        LOG.info("switch %s synced", self.core.switch_name(dp.id))
