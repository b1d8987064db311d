"""tandem's serving benchmark: replays Mooncake traces or synthetic workloads against any
OpenAI-compatible endpoint and reports vLLM-style latency metrics, goodput within SLOs,
Mooncake's TBT and SLO attainment, with JSON, Markdown and PNG outputs."""
