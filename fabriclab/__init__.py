"""fabriclab's session and command line: what composes the packages below it.

`fabriclab.session.Lab` starts a controller process, then the emulated fabric, and waits until it
is routed; `fabriclab.cli` is the `fabriclab` command; `fabriclab.pytest_plugin` offers the lab,
the probe and fault injection as pytest fixtures for suites users write themselves. Import arrows
point down only: fabriclab -> controller, traffic -> fabric.
"""
