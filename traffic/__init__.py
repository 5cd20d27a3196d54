"""fabriclab's traffic package: what a training job sends, where it runs, and what was measured.

Workloads (`workload`) read from traces (`traces`; `record` records a small real job) or generated (`llm`);
process groups (`parallel`), placement (`placement`) and how far the groups reach into a fabric (`reach`);
collectives as transfer DAGs (`collectives`, `dag_builder`); replay on the emulation or the simulator
(`replay`); the measurement definitions (`metrics`), results (`results`), reports (`report`) and numbers as
people read them (`formatting`); probes and flows between emulated hosts (`probe`, `probe_run`, `iperf`,
`ping`)."""
