"""fabriclab's SDN controller: an os-ken (Ryu) application over the shared fabric model.

Layers, after Faucet: `core` (pure: model + state -> intents), `ofmsg` (intents -> OpenFlow 1.3
messages built without a datapath), `app` (the thin os-ken shim), `process` (start/stop it).
"""
