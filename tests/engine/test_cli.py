"""`python -m paged.engine profile` writes the profile format the simulator loads; `generate` prints text."""
import json

import pytest

from paged.engine import LLM, SamplingParams
from paged.engine.__main__ import main
from paged.engine.profile import FEATURES, FORMAT


def test_profile_writes_the_simulator_format(tiny_llama, tmp_path):
    out = tmp_path / "profile.json"
    main(["profile", "--model", str(tiny_llama[0]), "--out", str(out), "--kv-cache-memory-bytes", str(4 << 20),
          "--prefill-chunks", "16,48", "--prefill-contexts", "0,32", "--decode-batches", "1,3",
          "--decode-contexts", "20,64", "--mixed-batches", "2", "--mixed-chunks", "16", "--mixed-context", "40",
          "--repeats", "1"])
    profile = json.loads(out.read_text())
    assert profile["format"] == FORMAT
    assert (profile["device"], profile["dtype"], profile["block_size"]) == ("cpu", "float32", 16)
    assert profile["model"] == str(tiny_llama[0]) and profile["num_threads"] >= 1
    # the KV cache profiled, which `sim run --cost-model` names beside the model
    engine = LLM(str(tiny_llama[0]), kv_cache_memory_bytes=4 << 20)
    assert profile["num_gpu_blocks"] == engine.scheduler.cache_config.num_gpu_blocks
    samples = profile["samples"]
    assert len(samples) == 4 + 6 + 2  # batches of one once; larger ones at contexts spread two ways
    assert all(set(s) == {*FEATURES, "time_s"} and s["time_s"] > 0 for s in samples)
    prefill, decode, mixed = samples[:4], samples[4:10], samples[10:]
    # chunk n after c cached tokens attends n*c + n(n+1)/2 pairs
    assert [(s["num_prefill_tokens"], s["prefill_attention_pairs"]) for s in prefill] == [
        (16, 136), (48, 1176), (16, 16 * 32 + 136), (48, 48 * 32 + 1176)]
    assert all(s["num_decode_tokens"] == 0 and s["num_seqs"] == 1 for s in prefill)
    assert [(s["num_decode_tokens"], s["num_prefill_tokens"]) for s in decode] == [(1, 0)] * 2 + [(3, 0)] * 4
    assert decode[0]["decode_context_sum"] == 20 and decode[1]["decode_context_sum"] == 64
    # Batches of 3, spread from the longest down to half of it, then down to 2 tokens: (20, 15, 10), (20, 10, 2), ...
    assert [s["decode_context_sum"] for s in decode[2:]] == [20 + 15 + 10, 20 + 10 + 2, 64 + 48 + 32, 64 + 32 + 2]
    assert all(s["num_decode_tokens"] == 2 and s["num_prefill_tokens"] == 16 and s["num_seqs"] == 3 for s in mixed)
    # Decodes at (40, 20) and (40, 2), a token later beside the chunk
    assert [s["decode_context_sum"] for s in mixed] == [41 + 21, 41 + 3]


def test_generate_command(tiny_llama, capsys):
    main(["generate", "--model", str(tiny_llama[0]), "--prompt", "Hi", "--max-tokens", "3",
          "--kv-cache-memory-bytes", str(1 << 20)])
    llm = LLM(str(tiny_llama[0]), kv_cache_memory_bytes=1 << 20)
    expected = llm.generate(["Hi"], SamplingParams(max_tokens=3, temperature=0.0))[0]
    assert expected.token_ids and capsys.readouterr().out == expected.text + "\n"


def test_bench_is_a_command_too(capsys):
    """`python -m paged.engine bench` is the engine benchmark (`paged bench engine`), not an error."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0 and "--hf-batch-size" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "bench" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["generate", "profile"])
def test_every_option_has_help(monkeypatch, capsys, command):
    """As every option of `python -m sim` has: --prompt, --max-tokens, --temperature, --out, --mixed-context
    and --repeats had none, so --help showed neither what they do nor their defaults."""
    import argparse

    parsers = []
    parse_args = argparse.ArgumentParser.parse_args

    def spy(self, *args, **kwargs):
        parsers.append(self)
        return parse_args(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", spy)
    with pytest.raises(SystemExit):
        main([command, "--help"])
    sub = next(a for a in parsers[0]._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    assert not [a.option_strings for a in sub._actions if not a.help]


@pytest.mark.parametrize("command", ["generate", "profile"])
def test_the_kv_cache_default_reads_in_mib(capsys, command):
    """`generate --help` printed 256 MiB and `profile --help` 1073741824 for the same option; profile's
    also says why it is larger than paged serve's."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "1073741824" not in text
    assert ("(default: 1024 MiB; paged serve's is 256 MiB" if command == "profile" else "(default: 256 MiB)") in text
