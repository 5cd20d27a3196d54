"""A researcher's own routing policy, as a user would write one (used by the tests to show the
extension point): every flow at every decision point takes the highest-numbered live equal-cost
port, whatever its source port; when that port's paths die, the next highest live one.

Run it with `--routing tests.policies:LastPortPolicy` (the module must be importable by the controller
process, e.g. via PYTHONPATH)."""
from __future__ import annotations

from fabric.routing import RoutingPolicy, SlotMove


class LastPortPolicy(RoutingPolicy):
    name = "last-port"

    def initial_port(self, switch: str, dest: str, slot: int, ports: tuple[int, ...]) -> int:
        return ports[-1]

    def react_to_link(self, link, up, changed, now) -> list[SlotMove]:
        moves = []
        cause = "recovery" if up else "failure"
        for key in changed:
            if not self.is_decision(*key) or not self.alive(*key):
                continue
            target = self.alive(*key)[-1]
            for slot, port in enumerate(self.slots(*key)):
                if port != target:
                    moves.append(self._set_slot(key, slot, target, cause))
        return moves
