"""Fleet simulator: vLLM-like replicas behind a router, driven by traces or synthetic workloads.

Import from the modules: `llmfleet.sim.engine` (simulate, SimConfig, PoolSpec, Fleet), `llmfleet.sim.workload`
(Request, Workload, synthetic), `llmfleet.sim.traces` (load_trace and each format's loader), `llmfleet.sim.routers`
(ROUTERS, make_router) and `llmfleet.sim.report` (plot, oracle_hit_rate). This package file imports nothing: `llmfleet --help` imports
`llmfleet.sim.cli`, and images without numpy (the operator's) must still start the CLI.
"""
