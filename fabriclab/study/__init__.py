"""The study layer: what a user's question is answered with, above the commands and below nothing of them.

- `spec`: the run specification (`RunSpec`) and `resolve`, where every "auto" choice is made;
- `main_job`: the main job's verdicts (emulated against simulated, and the whole step at scale).
The commands (`fabriclab.commands`) turn arguments into these requests and print what comes back.
"""
