"""The HTTP layer: OpenAI-compatible front ends and the tools around them.

`server` (`paged serve`: an OpenAI-compatible server over `AsyncLLM`, with Prometheus metrics
under vLLM's names and a view of the KV block pool; imports fastapi, the engine never does),
`router` (a load balancer over OpenAI-compatible servers, routed by `paged.core.routing`),
`launch` (N servers and a router, stopped together), `doctor` (the article's health checks of a
running server), `bench_serve` (a trace replayed in real time against a URL) and `bench_router`
(what the router adds to a request's latency). Everything here speaks plain OpenAI HTTP, so it
works in front of, or against, this project's server and vLLM alike.
"""
