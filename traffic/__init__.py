"""fabriclab's traffic package: trace parsers, collective schedules, replay and metrics (to come)."""
