"""The prefix-aware router's ids: equal exactly as far as two prompts agree block for block."""
from paged.core.hashing import extend_block_hashes
from paged.core.request import Request, SamplingParams
from paged.serve.launch import router_options
from paged.serve.prefix_ids import prefix_ids, token_block_hashes


def test_token_ids_agree_block_for_block():
    a = prefix_ids({"prompt": list(range(40))}, 16)
    b = prefix_ids({"prompt": list(range(32)) + [7] * 8}, 16)
    c = prefix_ids({"prompt": [99] + list(range(1, 40))}, 16)
    assert len(a) == 2 and a == b  # the partial third block names nothing
    assert c[0] != a[0] and c[1] != a[1]  # chained: a different first block changes every id after it
    assert prefix_ids({"prompt": [list(range(40)), [1, 2]]}, 16) == a  # a batch: its first prompt


def test_text_and_chat_are_hashed_in_blocks_of_characters():
    system = {"role": "system", "content": "x" * 64}
    one = prefix_ids({"messages": [system, {"role": "user", "content": "first question"}]}, 16)
    two = prefix_ids({"messages": [system, {"role": "user", "content": "another one"}]}, 16)
    assert one[:4] == two[:4] and one != two
    parts = {"role": "system", "content": [{"type": "text", "text": "x" * 64}]}
    assert prefix_ids({"messages": [parts]}, 16)[:4] == prefix_ids({"messages": [system]}, 16)[:4]
    assert prefix_ids({"prompt": "y" * 33}, 16) == prefix_ids({"prompt": "y" * 32 + "z"}, 16)
    assert prefix_ids({"model": "m"}, 16) is None


def test_the_launcher_gives_the_router_the_engines_block_size_batch_and_body_limit():
    assert router_options(["--max-num-seqs", "8", "--block-size", "32", "--num-gpu-blocks", "9"]) == [
        "--block-size", "32", "--max-num-seqs", "8"]
    assert router_options(["--block-size=8"]) == ["--block-size", "8"]
    assert router_options(["--max-num-seqs", "8"]) == ["--max-num-seqs", "8"]
    assert router_options(["--threads", "1"]) == []
    assert router_options(["--max-body-bytes", "9000000"]) == ["--max-body-bytes", "9000000"]


def test_the_router_sizes_prefix_aware_by_its_backends_batch():
    from paged.core.routing import balance_threshold
    from paged.serve.router import Forwarder, RouterConfig, build_parser

    args = build_parser().parse_args(["--backend", "http://a", "--policy", "prefix_aware", "--max-num-seqs", "8"])
    assert args.max_num_seqs == 8
    assert Forwarder(RouterConfig(["http://a"], "prefix_aware", max_num_seqs=8)).policy.balance_threshold == 3
    assert Forwarder(RouterConfig(["http://a"], "prefix_aware")).policy.balance_threshold == balance_threshold(256)


def test_the_router_gives_prefix_aware_its_cache_threshold():
    from paged.core.routing import DEFAULT_CACHE_THRESHOLD
    from paged.serve.router import Forwarder, RouterConfig, build_parser

    args = build_parser().parse_args(["--backend", "http://a", "--policy", "prefix_aware", "--cache-threshold", "0.5"])
    assert args.cache_threshold == 0.5
    assert Forwarder(RouterConfig(["http://a"], "prefix_aware", cache_threshold=0.5)).policy.cache_threshold == 0.5
    assert DEFAULT_CACHE_THRESHOLD == 0.3  # SGLang router's and vLLM router's default
    assert Forwarder(RouterConfig(["http://a"], "prefix_aware")).policy.cache_threshold == DEFAULT_CACHE_THRESHOLD


def test_kv_aware_hashes_a_token_prompt_as_the_engine_names_its_blocks():
    """kv_aware finds a prompt in the hashes the replicas report only if the router's hashes of
    its blocks are the engine's: same chain, same partial block left out."""
    ids = list(range(500, 550))
    engine = extend_block_hashes(Request("r", ids, sampling_params=SamplingParams(max_tokens=1)), 16, 8)
    assert len(engine) == 3 and token_block_hashes({"prompt": ids}, 16) == engine
    assert token_block_hashes({"prompt": [ids, [1]]}, 16) == engine  # a batch: its first prompt
    assert token_block_hashes({"prompt": "text"}, 16) is None  # the router has no tokenizer
    assert token_block_hashes({"messages": [{"role": "user", "content": "hi"}]}, 16) is None
