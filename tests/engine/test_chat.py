"""Chat templates: the model's own Jinja template, rendered in a sandbox exactly as transformers
renders it, and malformed messages refused with a ValueError naming what is wrong."""
import json
import shutil

import pytest

from paged.engine import LLM, SamplingParams
from paged.engine.chat_template import render_chat

from .conftest import TINY
from .tiny_models import BOS

# Exercises what transformers' environment provides: trimmed blocks, loop controls, raise_exception,
# bos/eos tokens, tojson keeping non-ASCII, add_generation_prompt.
TEMPLATE = """{{ bos_token }}
{% for message in messages %}
  {% if message['role'] not in ['system', 'user', 'assistant'] %}
    {{ raise_exception('Unknown role: ' + message['role']) }}
  {% endif %}
  {% if message['role'] == 'system' and not loop.first %}{% continue %}{% endif %}
[{{ message['role'] }}] {{ message['content'] }} {{ {'n': loop.index, 'k': 'é'} | tojson }}{{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}[assistant]{% endif %}"""
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, café?"},
            {"role": "assistant", "content": "Oui."}, {"role": "system", "content": "skipped"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]


@pytest.fixture(scope="module")
def chat_model(tiny_llama, tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat") / "m"
    shutil.copytree(tiny_llama[0], folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}, "add_bos_token": True,
        "chat_template": TEMPLATE}))
    return folder


def test_rendering_matches_transformers(chat_model):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(chat_model / "tokenizer.json"), bos_token="<s>",
                                 eos_token="</s>", chat_template=TEMPLATE)
    hf_messages = [{**m, "content": "a\nb"} if isinstance(m["content"], list) else m for m in MESSAGES]
    for gen in (True, False):
        ours = render_chat(TEMPLATE, MESSAGES, bos_token="<s>", eos_token="</s>", add_generation_prompt=gen)
        assert ours == hf.apply_chat_template(hf_messages, tokenize=False, add_generation_prompt=gen)
    assert "skipped" not in ours and '"é"' in ours


def test_chat_reads_the_template_from_the_folder_and_adds_no_second_bos(chat_model):
    llm = LLM(str(chat_model), **TINY)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    out = llm.chat(MESSAGES, params)[0]
    assert out.prompt.startswith("<s>\n[system] Be brief.") and out.prompt.endswith("[assistant]")
    assert out.prompt_token_ids.count(BOS) == 1
    assert out.token_ids == llm.generate([out.prompt_token_ids], params)[0].token_ids
    batch = llm.chat([MESSAGES[:2], MESSAGES[:3]], params)
    assert len(batch) == 2 and batch[0].prompt != batch[1].prompt
    custom = llm.chat(MESSAGES[:2], params, chat_template="{{ messages[-1]['content'] }}")[0]
    assert custom.prompt == "Hi, café?"
    with pytest.raises(ValueError, match="Unknown role: tool"):
        llm.chat([{"role": "tool", "content": "x"}], params)
    with pytest.raises(ValueError, match="conversation 1: messages\\[0\\].role"):
        llm.chat([MESSAGES[:1], [{"content": "x"}]], params)


@pytest.mark.parametrize(("messages", "what"), [
    ("hello", "messages='hello'"),
    ([], "messages=\\[\\]"),
    (["hi"], "messages\\[0\\]='hi'"),
    ([{"content": "x"}], "messages\\[0\\].role=None"),
    ([{"role": "", "content": "x"}], "messages\\[0\\].role=''"),
    ([{"role": "user"}], "messages\\[0\\]: missing 'content'"),
    ([{"role": "user", "content": None}], "messages\\[0\\].content is null"),
    ([{"role": "user", "content": 5}], "messages\\[0\\].content=5"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages\\[0\\].content\\[0\\]"),
])
def test_malformed_messages_name_the_problem(messages, what):
    with pytest.raises(ValueError, match=what):
        render_chat(TEMPLATE, messages)


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # the sandbox refuses Python's internals
    "{% set _ = messages.append(1) %}",  # and, immutable, any change to the messages
    "{% for %}",  # does not parse
])
def test_unsafe_or_broken_templates_are_value_errors(template):
    with pytest.raises(ValueError, match="chat template"):
        render_chat(template, MESSAGES[:2])


def test_a_model_without_a_template_says_so(tiny_llama):
    llm = LLM(str(tiny_llama[0]), **TINY)
    with pytest.raises(ValueError, match="no chat template"):
        llm.chat(MESSAGES[:2])
