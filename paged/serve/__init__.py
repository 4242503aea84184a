"""The HTTP layer: an OpenAI-compatible server over `AsyncLLM` (`paged serve`), with Prometheus
metrics under vLLM's names and a view of the KV block pool. Imports fastapi; the engine never does.
"""
