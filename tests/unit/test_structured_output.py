"""Structured output: the constraint type, its checks, and the engine on the tiny model (random weights),
whose constrained outputs must be valid whenever they end by themselves, over many seeds."""

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import xgrammar as xgr

from core import LLM, FinishReason, RequestRejected, SamplingParams, SamplingParamsError
from core.config import engine_config
from core.engine import LLMEngine
from core.grammar import Grammars, check, grammar_vocab_size
from core.structured_output import StructuredOutput, StructuredOutputError
from core.tokenizer import load_tokenizer
from gpu.batch import RowSampling, TokenMask
from gpu.sampler import Sampler

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{2,5}-\d{3}"
CHOICES = ("yes", "no", "maybe later")
GRAMMAR = 'root ::= "(" num ("+" num)* ")"\nnum ::= [0-9] | [1-9] [0-9]'


def is_valid_json(text: str) -> bool:
    import jsonschema  # here: tests/gpu import this module on a machine without it

    try:
        jsonschema.validate(json.loads(text), SCHEMA)  # json.loads refuses raw control characters in strings
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


KINDS = {
    "json_schema": (StructuredOutput(json_schema=json.dumps(SCHEMA)), is_valid_json),
    "regex": (StructuredOutput(regex=REGEX), lambda text: re.fullmatch(REGEX, text) is not None),
    "choice": (StructuredOutput(choice=CHOICES), lambda text: text in CHOICES),
    "grammar": (StructuredOutput(grammar=GRAMMAR), lambda text: re.fullmatch(r"\((\d{1,2})(\+\d{1,2})*\)", text)),
}


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: Path) -> LLM:
    return LLM(str(tiny_qwen3_dir), max_model_len=256, block_size=16, kv_cache_blocks=128,
               max_num_seqs=64, max_num_batched_tokens=256)


def test_exactly_one_kind_of_constraint() -> None:
    with pytest.raises(StructuredOutputError, match="got none"):
        StructuredOutput()
    with pytest.raises(StructuredOutputError, match="got json_object, regex"):
        StructuredOutput(json_object=True, regex="a")
    with pytest.raises(StructuredOutputError, match="choice"):
        StructuredOutput(choice=())
    assert StructuredOutput(regex="a", param="x") == StructuredOutput(regex="a")  # param names, it does not constrain
    assert StructuredOutput(choice=["a"]).choice == ("a",)


@pytest.mark.parametrize(("constraint", "message"), [
    (StructuredOutput(json_schema="{not json"), "not valid JSON"),
    (StructuredOutput(json_schema='{"type": "strang"}'), 'Unsupported type "strang"'),
    (StructuredOutput(json_schema='{"$ref": "#/$defs/missing"}'), "missing"),
    (StructuredOutput(json_schema='{"type": "array", "uniqueItems": true}'), "'uniqueItems' \\(at #\\)"),
    (StructuredOutput(json_schema='{"properties": {"a": {"not": {"type": "string"}}}}'),
     "'not' \\(at #/properties/a\\)"),
    (StructuredOutput(regex="(unclosed", param="structured_outputs.regex"), "parenthesis is not closed"),
    (StructuredOutput(grammar='root ::= foo'), 'Rule "foo" is not defined'),
])
def test_a_constraint_that_cannot_compile_is_refused_with_the_reason(constraint: StructuredOutput,
                                                                     message: str) -> None:
    with pytest.raises(StructuredOutputError, match=message) as raised:
        check(constraint)
    assert raised.value.param == constraint.param
    assert not str(raised.value).startswith("[")  # xgrammar's log prefix is gone


def test_properties_named_like_keywords_are_not_keywords() -> None:
    check(StructuredOutput(json_schema='{"properties": {"not": {"enum": ["if", "then"]}}, "required": ["not"]}'))


def test_length_bounded_json_strings_refuse_raw_control_characters(llm: LLM) -> None:
    """xgrammar 0.2.8 lets them into strings with maxLength: core/grammar.py takes them out."""
    grammars = Grammars(llm.tokenizer, 512, (2,), max_rows=4)
    constraint = StructuredOutput(json_schema='{"type": "string", "maxLength": 5}')
    accepts = [Grammars.matcher(grammars.compile(constraint).result()).accept_string(s) for s in ('"ab\x01', '"ab c"')]
    assert accepts == [False, True]
    raw = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(llm.tokenizer, vocab_size=512)).compile_json_schema(
        '{"type": "string", "maxLength": 5}')
    assert xgr.GrammarMatcher(raw).accept_string('"ab\x01')  # still so upstream: the fix above is needed


def test_constrained_outputs_are_valid_whenever_they_end_by_themselves(llm: LLM) -> None:
    """Random weights, 24 seeds per kind, every kind in one batch: an output that ends by EOS is valid;
    only a max_tokens cut-off may leave it unfinished, and then its finish reason says length."""
    prompts, params, kinds = [], [], []
    for name, (constraint, _) in KINDS.items():
        for seed in range(24):
            prompts.append([5 + seed, 6, 7])
            params.append(SamplingParams(temperature=0.7 + seed % 3 * 0.3, seed=seed, max_tokens=64,
                                         structured_output=constraint))
            kinds.append(name)
    outputs = llm.generate(prompts, params)
    reasons: Counter[tuple[str, FinishReason]] = Counter()
    for kind, out in zip(kinds, outputs, strict=True):
        reasons[kind, out.finish_reason] += 1
        if out.finish_reason is FinishReason.STOP:
            assert KINDS[kind][1](out.text), (kind, out.text)
            assert out.token_ids[-1] == 2  # ended by EOS, which the grammar allowed only once complete
        else:
            assert out.finish_reason is FinishReason.LENGTH and len(out.token_ids) == 64
    for kind in KINDS:
        assert reasons[kind, FinishReason.STOP] >= 16, reasons  # the property is not vacuous
    assert len({o.text for o in outputs[:24]}) > 12  # the seeds give different outputs


def test_constrained_and_free_rows_share_a_batch_without_touching_each_other(llm: LLM) -> None:
    free = SamplingParams(temperature=1.0, seed=3, max_tokens=20, ignore_eos=True)
    alone = llm.generate([[9, 9, 9]], free)[0].token_ids
    constrained = SamplingParams(temperature=1.0, seed=4, max_tokens=20, structured_output=KINDS["regex"][0])
    batch = llm.generate([[1, 2], [9, 9, 9], [3, 4, 5]], [constrained, free, constrained])
    assert batch[1].token_ids == alone
    assert all(re.fullmatch(REGEX, batch[i].text) for i in (0, 2))


def test_json_object_gives_a_json_object(llm: LLM) -> None:
    constraint = StructuredOutput(json_object=True)
    outputs = llm.generate([[5, 6]] * 8, [SamplingParams(seed=s, max_tokens=48, structured_output=constraint)
                                          for s in range(8)])
    for out in outputs:
        assert out.text.startswith("{")
        if out.finish_reason is FinishReason.STOP:
            assert isinstance(json.loads(out.text), dict)


def constrained_run(model_dir: Path, num_blocks: int, async_scheduling: bool) -> tuple[LLM, list]:
    llm = LLM(str(model_dir), max_model_len=256, block_size=8, kv_cache_blocks=num_blocks,
              max_num_seqs=8, max_num_batched_tokens=32, async_scheduling=async_scheduling)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=40, structured_output=KINDS["json_schema"][0])
              for s in range(6)]
    return llm, llm.generate([[5 + s] * (3 + 5 * s) for s in range(6)], params)


def test_async_scheduling_and_preemption_give_the_tokens_of_a_plain_run(tiny_qwen3_dir: Path) -> None:
    """Masks for step N+1 are filled while it runs, after step N's tokens reach the matchers; with few
    KV blocks, preempted sequences keep their matcher and go on where they were."""
    _, expected = constrained_run(tiny_qwen3_dir, num_blocks=128, async_scheduling=False)
    llm, outputs = constrained_run(tiny_qwen3_dir, num_blocks=12, async_scheduling=True)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    stopped = [o for o in outputs if o.finish_reason is FinishReason.STOP]
    assert stopped and all(is_valid_json(o.text) for o in stopped)


def test_requests_are_checked_before_the_engine(llm: LLM) -> None:
    with pytest.raises(RequestRejected, match="uniqueItems") as raised:
        llm.generate([[1, 2]], SamplingParams(structured_output=StructuredOutput(
            json_schema='{"type": "array", "uniqueItems": true}', param="response_format")))
    assert raised.value.param == "response_format"
    with pytest.raises(RequestRejected, match="logit_bias"):
        llm.generate([[1, 2]], SamplingParams(logit_bias={512: 1.0}))
    with pytest.raises(SamplingParamsError, match="min_tokens"):
        SamplingParams(min_tokens=2, structured_output=StructuredOutput(regex="a+"))
    with pytest.raises(SamplingParamsError, match="ignore_eos"):
        SamplingParams(ignore_eos=True, structured_output=StructuredOutput(regex="a+"))
    assert not llm.engine.has_unfinished_requests()


def test_abort_while_the_grammar_compiles(llm: LLM) -> None:
    engine = llm.engine
    constraint = StructuredOutput(json_schema=json.dumps({**SCHEMA, "title": "never compiled before"}))
    engine.add_request("compiling", [1, 2, 3], SamplingParams(max_tokens=8, structured_output=constraint))
    engine.abort_request("compiling")
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert [(o.request_id, o.finish_reason) for o in outputs] == [("compiling", FinishReason.ABORT)]
    assert engine.stats().num_used_blocks == 0


def test_a_grammar_that_fails_to_compile_in_the_engine_fails_its_request_alone(llm: LLM) -> None:
    """Front ends check first (core/request_checks.py); a request that skipped the check still cannot
    take the engine down: it ends with an error and the others go on."""
    engine = llm.engine
    bad = StructuredOutput(json_schema='{"type": "strang"}')
    engine.add_request("bad", [1, 2, 3], SamplingParams(max_tokens=4, structured_output=bad))
    engine.add_request("good", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert outputs["bad"][-1].finish_reason is FinishReason.ERROR and not outputs["bad"][-1].new_token_ids
    assert sum(len(o.new_token_ids) for o in outputs["good"]) == 4


def test_masks_cover_the_tokenizers_ids_and_the_stop_ids_not_the_models_padding(llm: LLM) -> None:
    """xgrammar fills a row and checks a token in time that grows with the ids past the tokenizer's (core/grammar.py):
    masks stop at the tokenizer's, and the sampler disallows every id past a mask's words."""
    tokenizer = llm.tokenizer
    assert len(tokenizer) == 512
    assert grammar_vocab_size(tokenizer, 151936, (2,)) == 512
    assert grammar_vocab_size(tokenizer, 151936, (2, 700)) == 701  # a stop id past the tokenizer's stays allowable
    assert grammar_vocab_size(tokenizer, 300, (2,)) == 300  # never past the model's
    grammars = Grammars(tokenizer, 1000, (2,), max_rows=2)
    matcher = Grammars.matcher(grammars.compile(KINDS["regex"][0]).result())
    bitmask = grammars.fill([matcher, None])
    assert bitmask.shape == (2, 16)  # 512 ids, not 1000
    logits = torch.zeros(2, 1000)
    logits[:, 900] = 100.0  # the model's favourite, past the tokenizer's ids
    token_ids = Sampler(torch.device("cpu"), seed=0)(logits, [RowSampling(temperature=1.0)] * 2,
                                                     token_mask=TokenMask([0, 1], bitmask)).token_ids
    assert all(t < 512 for t in token_ids) and matcher.accept_token(token_ids[0])


def allowed_ids(bitmask_row: object) -> set[int]:
    words = np.asarray(bitmask_row).view(np.uint32)
    return {t for t in range(32 * len(words)) if (int(words[t // 32]) >> (t % 32)) & 1}


def test_no_mask_allows_an_id_past_its_vocabulary_in_its_last_word(llm: LLM) -> None:
    """xgrammar fills a row whose grammar allows most tokens as 'all bits, then clear the refused' and sets the bits
    past its vocabulary in the last word too: with a vocabulary that is no multiple of 32 those ids (real logits
    of the model's padded vocabulary) would be open to sampling."""
    grammars = Grammars(llm.tokenizer, 1000, (2, 700), max_rows=3)  # 701 ids: bits 701..703 of word 21 are padding
    open_grammar = StructuredOutput(grammar='root ::= [^"]*')  # most tokens allowed, the stop ids too (any end)
    matcher = Grammars.matcher(grammars.compile(open_grammar).result())
    bitmask = grammars.fill([matcher, None, Grammars.matcher(grammars.compile(KINDS["regex"][0]).result())])
    assert bitmask.shape == (3, 22)
    for row in bitmask:
        assert max(allowed_ids(row)) <= 700
    open_ids = allowed_ids(bitmask[0])
    assert len(open_ids) > 400 and {2, 700} <= open_ids  # the stop ids: this grammar may end anywhere
    assert not open_ids & set(range(512, 700))  # ids the tokenizer lacks
    assert not {2, 700} & allowed_ids(bitmask[2])  # the regex cannot end before its first character
    logits = torch.zeros(1, 1000)
    logits[0, 701:704] = 100.0  # the model's favourites, inside the mask's last word
    token_ids = Sampler(torch.device("cpu"), seed=0)(logits, [RowSampling(temperature=1.0)],
                                                     token_mask=TokenMask([0], bitmask[:1])).token_ids
    assert token_ids[0] in open_ids


class WrongTokenRunner:
    """The real runner, except that the first constrained step's token for row 0 is replaced by EOS, which its
    grammar (unfinished) refuses."""

    def __init__(self, runner: object, eos_token_id: int) -> None:
        self._runner = runner
        self._eos_token_id = eos_token_id
        self.num_replaced = 0

    def sample_masked(self, pending: object, token_mask: TokenMask) -> object:
        step = self._runner.sample_masked(pending, token_mask)  # type: ignore[attr-defined]
        result = step.result()
        if not self.num_replaced:
            self.num_replaced += 1
            result = replace(result, token_ids=[self._eos_token_id, *result.token_ids[1:]])
        return SimpleNamespace(result=lambda: result, sampled_token_ids=step.sampled_token_ids)

    def __getattr__(self, name: str) -> object:
        return getattr(self._runner, name)


def test_a_token_outside_its_grammar_ends_that_request_alone(tiny_qwen3_dir: Path) -> None:
    config = engine_config(str(tiny_qwen3_dir), max_model_len=256, block_size=16, kv_cache_blocks=64, max_num_seqs=4)
    plain = LLMEngine(config)
    engine = LLMEngine(config, runner=WrongTokenRunner(plain.runner, plain.eos_token_ids[0]))  # type: ignore[arg-type]
    for i in range(3):
        engine.add_request(f"r{i}", [5 + i, 6, 7], SamplingParams(temperature=1.0, seed=i, max_tokens=24,
                                                                    structured_output=KINDS["regex"][0]))
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert engine.runner.num_replaced == 1
    assert outputs["r0"][-1].finish_reason is FinishReason.ERROR
    texts = {rid: llm_text(tiny_qwen3_dir, [t for o in outs for t in o.new_token_ids]) for rid, outs in outputs.items()}
    assert all(outputs[rid][-1].finish_reason is FinishReason.STOP and re.fullmatch(REGEX, texts[rid])
               for rid in ("r1", "r2")), texts
    assert engine.stats().num_used_blocks == 0


def llm_text(model_dir: Path, token_ids: list[int]) -> str:
    return load_tokenizer(str(model_dir)).decode(token_ids, skip_special_tokens=True)


LATE_IMPORT = """
import gc, sys
from core import LLM, SamplingParams
from core.startup_gc import freeze_startup_objects
from core.structured_output import StructuredOutput

llm = LLM(sys.argv[1])
assert "xgrammar" not in sys.modules, "imported at start-up"
frozen = freeze_startup_objects()  # as the engine's process does once the engine is built
llm.generate([[5, 6]], SamplingParams(max_tokens=4))
assert "xgrammar" not in sys.modules
out = llm.generate([[5, 6]], SamplingParams(max_tokens=6, structured_output=StructuredOutput(regex="[a-z]{2,5}")))
assert "xgrammar" in sys.modules and gc.get_freeze_count() > frozen + 10_000, (gc.get_freeze_count(), frozen)
print("ok", out[0].text)
"""


def test_xgrammar_comes_with_the_first_structured_request_and_is_frozen_like_start_ups(tiny_qwen3_dir: Path) -> None:
    """The engine imports xgrammar (and the tokenizer) at its first structured-output request, not at start-up; what
    that brings in joins start-up's frozen objects (core/startup_gc.py) where those were frozen. A fresh process:
    this one has imported xgrammar long ago."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", LATE_IMPORT, str(tiny_qwen3_dir)], capture_output=True, text=True,
                            timeout=300, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr[-3000:]
