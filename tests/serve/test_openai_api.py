"""The official `openai` client against a real server: completions in OpenAI's four prompt forms,
chat, streaming, usage, and greedy output equal token for token to `LLM.generate`."""
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from paged.engine import LLM, SamplingParams

from .conftest import ENGINE, TEMPLATE

IGNORE_EOS = {"ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models_and_health(server, client, model_name):
    assert server.get("/health").status_code == 200
    assert [m.id for m in client.models.list().data] == [model_name]


def test_greedy_over_http_equals_llm_generate(client, model_name, tiny_chat_model):
    """The same model and settings in-process: every token the same, for every prompt form."""
    llm = LLM(str(tiny_chat_model), **ENGINE)
    prompts = ["Hello there", [104, 105, 33], "x"]
    ref = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    out = client.completions.create(model=model_name, prompt=["Hello there", "x"], max_tokens=12, temperature=0,
                                    extra_body=IGNORE_EOS)
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.model_extra["token_ids"] for c in out.choices] == [ref[0].token_ids, ref[2].token_ids]
    assert [c.text for c in out.choices] == [ref[0].text, ref[2].text]
    for prompt in ([104, 105, 33], [[104, 105, 33]]):
        ids = client.completions.create(model=model_name, prompt=prompt, max_tokens=12, temperature=0,
                                        extra_body=IGNORE_EOS)
        assert ids.choices[0].model_extra["token_ids"] == ref[1].token_ids
    assert out.usage.prompt_tokens == len(ref[0].prompt_token_ids) + len(ref[2].prompt_token_ids)
    assert out.usage.completion_tokens == 24 and out.usage.total_tokens == out.usage.prompt_tokens + 24


def test_streaming_matches_the_whole_response_and_reports_usage(client, model_name):
    kwargs = {"model": model_name, "prompt": "Stream me", "max_tokens": 10, "temperature": 0, "extra_body": IGNORE_EOS}
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert len(chunks) > 2
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]] == \
        whole.choices[0].model_extra["token_ids"]
    assert chunks[-2].choices[0].finish_reason == "length"
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 10
    assert all(c.usage is None for c in chunks[:-1])


def test_parallel_samples_and_seeds(client, model_name):
    kwargs = {"model": model_name, "prompt": ["a", "b"], "max_tokens": 6, "temperature": 1.0, "n": 2, "seed": 3,
              "extra_body": IGNORE_EOS}
    first, again = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert first.usage.completion_tokens == 24
    top = client.completions.create(model=model_name, prompt="a", max_tokens=6, temperature=1.0, n=2,
                                    extra_body={**IGNORE_EOS, "top_k": 1})
    greedy = client.completions.create(model=model_name, prompt="a", max_tokens=6, temperature=0,
                                       extra_body=IGNORE_EOS)
    assert {c.text for c in top.choices} == {greedy.choices[0].text}


def test_stop_strings_min_tokens_and_ignore_eos(client, model_name):
    base = {"model": model_name, "prompt": "Once upon a time", "temperature": 0, "max_tokens": 20}
    full = client.completions.create(**base, extra_body=IGNORE_EOS).choices[0]
    stop = full.text[5:7]
    cut = client.completions.create(**base, stop=[stop], extra_body=IGNORE_EOS).choices[0]
    assert (cut.text, cut.finish_reason) == (full.text[:full.text.index(stop)], "stop")
    streamed = client.completions.create(**base, stop=stop, stream=True, extra_body=IGNORE_EOS)
    assert "".join(c.choices[0].text for c in streamed) == cut.text
    first = full.model_extra["token_ids"][0]
    held = client.completions.create(**base, extra_body={**IGNORE_EOS, "stop_token_ids": [first], "min_tokens": 4})
    assert len(held.choices[0].model_extra["token_ids"]) >= 4


def test_chat_with_the_models_template(client, model_name, tiny_chat_model):
    messages = [{"role": "user", "content": "Hi"}]
    llm = LLM(str(tiny_chat_model), **ENGINE)
    ref = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
    assert ref.prompt == "<user>Hi</s><assistant>" and TEMPLATE
    out = client.chat.completions.create(model=model_name, messages=messages, max_tokens=8, temperature=0,
                                         extra_body=IGNORE_EOS)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].model_extra["token_ids"] == ref.token_ids
    assert out.usage.prompt_tokens == len(ref.prompt_token_ids)
    chunks = list(client.chat.completions.create(model=model_name, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body=IGNORE_EOS))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == out.choices[0].message.content
    assert chunks[-1].usage.total_tokens == out.usage.total_tokens


def test_metrics_have_vllm_names_and_count_requests(server, client, model_name):
    def scrape():
        families = {f.name: f for f in text_string_to_metric_families(server.get("/metrics").text)}
        return families, {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values()
                          for s in f.samples}

    _, before = scrape()
    client.completions.create(model=model_name, prompt="count", max_tokens=7, temperature=0, extra_body=IGNORE_EOS)
    families, after = scrape()
    label = (("model_name", model_name),)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
                 "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
                 "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "paged:kv_cache_fragmentation", "paged:effective_batch_size", "paged:queue_depth",
                 "paged:block_allocations", "paged:block_frees", "paged:aborted_requests"):
        assert name in families, name
    assert families["vllm:e2e_request_latency_seconds"].type == "histogram"

    def delta(name, labels=label):
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    assert delta("vllm:generation_tokens_total") == 7
    assert delta("vllm:prompt_tokens_total") == 5
    assert delta("vllm:request_success_total", (("finished_reason", "length"), *label)) == 1
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:inter_token_latency_seconds_count") == 6
    assert delta("vllm:prefix_cache_queries_total") == 5
    assert delta("paged:block_allocations_total") >= 1
    assert after[("paged:block_allocations_total", label)] - after[("paged:block_frees_total", label)] == \
        server.get("/debug/kv").json()["pool"]["used"]


def test_debug_steps_pages_the_engines_steps(server, client, model_name):
    mark = server.get("/debug/steps", params={"since": 1 << 40}).json()["next"]
    client.completions.create(model=model_name, prompt=[7, 8, 9], max_tokens=4, temperature=0, extra_body=IGNORE_EOS)
    steps = server.get("/debug/steps", params={"since": mark}).json()
    assert [s["seq"] for s in steps["steps"]] == list(range(mark, steps["next"]))
    assert [(s["num_prefill_tokens"], s["num_decode_tokens"]) for s in steps["steps"]] == [(3, 0)] + [(0, 1)] * 3
    assert all(s["forward_s"] > 0 for s in steps["steps"])
    bad = server.get("/debug/steps", params={"since": -1})  # vLLM's 400 in OpenAI's shape, not FastAPI's 422
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"


def test_usage_reports_the_prompt_tokens_found_cached(client, model_name):
    """vLLM's `prompt_tokens_details.cached_tokens`: 0 for a prompt the cache has never seen, then
    its full blocks but the last token's (which is always computed) for the same prompt again, streamed
    or not; a prompt that shares only its first block hits that block."""
    block = 16
    prompt = list(range(200, 200 + 3 * block + 5))  # token ids the tiny vocabulary has, no other test sends
    kwargs = {"model": model_name, "max_tokens": 2, "temperature": 0, "extra_body": IGNORE_EOS}
    first = client.completions.create(prompt=prompt, **kwargs)
    again = client.completions.create(prompt=prompt, **kwargs)
    streamed = list(client.completions.create(prompt=prompt, stream=True, stream_options={"include_usage": True},
                                              **kwargs))
    forked = client.completions.create(prompt=prompt[:block] + [7] * (2 * block), **kwargs)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 3 * block
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == 3 * block
    assert forked.usage.prompt_tokens_details.cached_tokens == block
