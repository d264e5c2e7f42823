"""Speculative decoding's parts, each alone: the config's checks, prompt lookup, the draft-length controller's
decisions on injected costs, the blocks of rejected drafts, the verification's output distribution (a
statistical test with a fixed seed) and the metrics."""

import re
from array import array
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from core.block_manager import BlockManager
from core.config import engine_config
from core.engine import EngineStats
from core.ngram_proposer import NgramProposer, PackedTokens, lookup_draft
from core.sampling_params import SamplingParams
from core.sequence import Sequence
from core.speculation import FOLLOWED_PER_SEQUENCE, Speculation
from core.speculation_control import DraftLengthController
from core.speculative_config import SpeculativeConfig, parse_speculative_config
from core.suffix_proposer import OutputCache, SuffixProposer, longest_match, walk
from gpu.batch import Batch, RowSampling
from gpu.kv_cache_groups import KVCacheGroup
from gpu.sampler import Sampler
from openai_serve.cli import parse_settings
from openai_serve.metrics import ServerMetrics

# -- config


def test_the_flag_and_llm_keyword_take_vllms_keys() -> None:
    settings = parse_settings(["--model", "m", "--speculative-config",
                               '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 6}'])
    assert settings.engine.scheduler.speculative_config == SpeculativeConfig("ngram", 5, 1, 6)
    config = engine_config("m", speculative_config={"method": "ngram", "prompt_lookup_min": 2})
    assert config.scheduler.speculative_config == SpeculativeConfig("ngram", 3, 2, 4)
    assert engine_config("m").scheduler.speculative_config is None
    fixed = parse_speculative_config('{"num_speculative_tokens": 2, "adaptive": false}')
    assert Speculation(fixed, max_model_len=64).controller.choose(256) == 2


@pytest.mark.parametrize(("value", "named"), [
    ('{"method": "ngram", "num_speculative_token": 3}', "num_speculative_token"),
    ('{"method": "medusa"}', "method"),
    ('{"method": "suffix", "suffix_decoding_min_token_prob": 2}', "suffix_decoding_min_token_prob"),
    ('{"method": "suffix", "suffix_decoding_max_tree_depth": "8"}', "suffix_decoding_max_tree_depth"),
    ('{"method": "eagle3"}', "speculative_config.model must name the draft checkpoint .* for method eagle3"),
    ('{"method": "mtp", "model": "x"}', "speculative_config.model names a draft checkpoint"),
    ('{"method": "draft_model"}', "speculative_config.model must name the draft checkpoint"),
    ('{"method": "ngram", "model": "small"}', "speculative_config.model names a draft checkpoint"),
    ('{"num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"num_speculative_tokens": "4"}', "num_speculative_tokens"),
    ('{"prompt_lookup_min": 3, "prompt_lookup_max": 2}', "prompt_lookup_max"),
    ('{"adaptive": 1}', "adaptive"),
    ('[1, 2]', "JSON object"),
    ('{"method": ', "JSON object"),
])
def test_a_bad_config_is_an_error_naming_the_key(value: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_speculative_config(value)


def test_a_bad_flag_stops_the_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--model", "m", "--speculative-config", '{"method": "medusa"}'])
    assert "speculative_config.method must be one of" in capsys.readouterr().err


def test_suffix_takes_vllms_keys_and_drafts_as_deep_as_its_tree() -> None:
    config = parse_speculative_config('{"method": "suffix", "suffix_decoding_max_tree_depth": 12}')
    assert config.num_speculative_tokens == 12 and config.suffix_decoding_min_token_prob == 0.1
    assert parse_speculative_config('{"method": "suffix"}').num_speculative_tokens == 16


# -- prompt lookup


def test_lookup_takes_the_longest_suffix_and_its_latest_occurrence() -> None:
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # "2 3" occurs at 1-2 and 5-6; "5 2 3" nowhere earlier; with max n 2 the latest "2 3" is followed by 7 8 5.
    assert lookup_draft(tokens, 3, 1, 2) == [7, 8, 5]
    tokens = [4, 1, 2, 3, 6, 6, 2, 3, 5, 0, 1, 2, 3]
    assert lookup_draft(tokens, 2, 1, 3) == [6, 6]  # "1 2 3" beats the later "2 3"
    assert lookup_draft(tokens, 2, 1, 2) == [5, 0]
    assert lookup_draft(tokens, 9, 4, 4) == []  # no earlier "0 1 2 3"
    assert lookup_draft([5, 5], 3, 1, 4) == [5, 5, 5]  # a loop goes on past the end
    assert lookup_draft([1, 2, 3, 1, 2], 5, 1, 4) == [3, 1, 2, 3, 1]
    assert lookup_draft([1, 2, 3], 3, 1, 4) == []


def test_lookup_matches_whole_tokens_only() -> None:
    # Packed 4 bytes a token (little-endian), 2**24 0 2**24 is 00 00 00 01 00 00 00 00 00 00 00 01: from its fourth
    # byte on it holds the bytes of "1 0" (01 00 00 00 00 00 00 00) across token boundaries, later than the only
    # whole-token "1 0" before the end, at the start.
    tokens = [1, 0, 7, 1 << 24, 0, 1 << 24, 9, 1, 0]
    assert lookup_draft(tokens, 2, 2, 2) == [7, 1 << 24]
    assert lookup_draft([1 << 24, 0, 1 << 24, 5, 1, 0], 2, 2, 2) == []


def test_lookup_agrees_with_a_plain_search_on_random_sequences() -> None:
    rng = np.random.default_rng(0)
    for _ in range(400):
        # Few distinct tokens (many matches), and tokens whose bytes line up across boundaries.
        alphabet = [[0, 1, 2, 3], [0, 1, 256, 1 << 24, (1 << 24) + 1]][int(rng.integers(2))]
        tokens = rng.choice(alphabet, size=int(rng.integers(1, 40))).tolist()
        min_n, max_n = sorted(rng.integers(1, 5, size=2).tolist())
        assert lookup_draft(tokens, 3, min_n, max_n) == _plain_lookup(tokens, 3, min_n, max_n)


def _plain_lookup(tokens: list[int], max_drafts: int, min_n: int, max_n: int) -> list[int]:
    """The definition, one comparison at a time."""
    for n in range(max_n, min_n - 1, -1):
        suffix = tokens[len(tokens) - n :]
        ends = [e for e in range(n - 1, len(tokens) - 1) if n < len(tokens) and tokens[e - n + 1 : e + 1] == suffix]
        if ends:
            period = len(tokens) - 1 - ends[-1]
            return [tokens[ends[-1] + 1 + i % period] for i in range(max_drafts)]
    return []


def test_a_verifying_batch_samples_each_rows_verified_positions() -> None:
    greedy, seeded = RowSampling(), RowSampling(temperature=0.5, seed=3, output_index=7)
    batch = Batch(token_ids=[0] * 12, positions=[0] * 12, slot_mapping=[0] * 12, query_lens=[5, 1, 4, 2],
                  context_lens=[5, 9, 9, 9], block_tables=[[0]] * 4, sampling=[None, greedy, seeded, greedy],
                  num_draft_tokens=[0, 0, 3, 1])
    rows, token_indices = batch.sampled_positions()
    assert token_indices.tolist() == [5, 6, 7, 8, 9, 10, 11]
    assert rows[0] is greedy and rows[1] is seeded and rows[5] is rows[6] is greedy
    assert [row.output_index for row in rows[1:5]] == [7, 8, 9, 10]
    assert all(row.seed == 3 for row in rows[1:5])


def test_the_proposer_reads_each_sequence_incrementally() -> None:
    seq = Sequence("r", [1, 2, 3, 1], SamplingParams(), max_tokens=10)
    proposer = NgramProposer(1, 3)
    proposer.propose([seq], [2])
    assert seq.draft_token_ids == [2, 3]
    assert isinstance(seq.draft_state, PackedTokens)
    seq.token_ids += [2] * 100 + [5]
    proposer.propose([seq], [4])
    assert seq.draft_token_ids == []  # 5 never came before
    seq.token_ids += [2, 3]
    proposer.propose([seq], [3])
    assert seq.draft_token_ids == [1, 2, 2]
    assert seq.draft_state.sync(seq.token_ids) == array("i", seq.token_ids).tobytes()


def test_only_plain_decoding_sequences_get_drafts_within_their_limits() -> None:
    speculation = Speculation(SpeculativeConfig(num_speculative_tokens=4), max_model_len=64)

    def decoding(params: SamplingParams, num_outputs: int = 3, max_tokens: int = 20) -> Sequence:
        seq = Sequence("r", [7, 8, 9] * 5, params, max_tokens=max_tokens)
        seq.token_ids += [7, 8, 9][:num_outputs]
        seq.num_tokens = len(seq.token_ids)
        seq.num_computed_tokens = seq.num_tokens - 1
        return seq

    plain, near_end = decoding(SamplingParams()), decoding(SamplingParams(), max_tokens=5)
    penalized = decoding(SamplingParams(frequency_penalty=0.5))
    early = decoding(SamplingParams(min_tokens=5))
    speculation.propose([plain, near_end, penalized, early], 4, None)
    assert (plain.draft_token_ids, near_end.draft_token_ids) == ([7, 8, 9, 7], [7])
    assert penalized.draft_token_ids == early.draft_token_ids == []


def test_drafts_are_followed_at_every_step() -> None:
    """Prompt lookup's drafts (the most the config allows) for decoding sequences (their last token in flight, as
    under asynchronous scheduling) are compared with the tokens they then generate: a sample of the controller's
    acceptance once those are known; a draft opened a step for each sequence in turn while fewer than MAX_FOLLOWED
    are open; a penalized sequence's sample (once as many tokens are known) is that nothing would have been
    accepted."""
    speculation = Speculation(SpeculativeConfig(num_speculative_tokens=3), max_model_len=64)
    controller = speculation.controller
    assert isinstance(controller, DraftLengthController)

    def in_flight(params: SamplingParams) -> Sequence:
        seq = Sequence("r", [7, 8, 9] * 5 + [7], params, max_tokens=40)
        seq.num_tokens = len(seq.token_ids) + 1  # the token after the last 7 is pending
        seq.num_computed_tokens = seq.num_tokens - 1
        return seq

    seq, penalized = in_flight(SamplingParams()), in_flight(SamplingParams(presence_penalty=0.5))
    speculation.follow_drafts([seq, penalized])
    assert [f.drafts for f in speculation._followed] == [[8, 9, 7], []]  # noqa: SLF001 - what is followed
    seq.token_ids += [8, 9]  # the pending 8, then 9: two of three drafts known
    penalized.token_ids += [8, 9, 7]
    speculation.follow_drafts([seq, penalized])
    assert controller.expected_tokens(3) == 1.0  # the penalized one's sample: nothing accepted
    assert [f.drafts for f in speculation._followed] == [[8, 9, 7], [7, 8, 9], []]  # noqa: SLF001 - one more each
    seq.token_ids += [5]
    speculation.follow_drafts([seq, penalized])
    assert controller.expected_tokens(3) == pytest.approx(1.0 + 0.5 + 0.5 + 0.0)  # the mean of the two samples
    assert len(speculation._followed) == 4  # noqa: SLF001 - one opened a step for each sequence
    for _ in range(6):  # no tokens come: at most FOLLOWED_PER_SEQUENCE a sequence stay open
        speculation.follow_drafts([seq, penalized])
    assert len(speculation._followed) == 2 * FOLLOWED_PER_SEQUENCE  # noqa: SLF001 - what is followed


@pytest.mark.parametrize(("longest_seconds", "followed"), [(4.5, []), (3.5, [[8, 9, 7]])])
def test_drafts_are_not_followed_where_acceptance_cannot_change_the_choice(
        longest_seconds: float, followed: list[list[int]]) -> None:
    """Verifying 3 drafts measured at 4.5 plain steps: even all accepted (4 tokens) every length loses (the untried
    ones on the line between), so lookups there would cost the host and tell nothing; at 3.5 plain steps they could
    win. An unmeasured batch size follows."""
    speculation = Speculation(SpeculativeConfig(num_speculative_tokens=3), max_model_len=64)
    controller = speculation.controller
    assert isinstance(controller, DraftLengthController)
    seq = Sequence("r", [7, 8, 9] * 5 + [7], SamplingParams(), max_tokens=40)
    seq.num_tokens = len(seq.token_ids) + 1
    seq.num_computed_tokens = seq.num_tokens - 1
    run_controller({0: 1.0, 1: 2.2, 2: 3.4, 3: longest_seconds}, [1.0, 1.0, 1.0], controller=controller)
    assert controller.acceptance_matters(1) == bool(followed) and controller.acceptance_matters(200)
    speculation.follow_drafts([seq])
    assert [f.drafts for f in speculation._followed] == followed  # noqa: SLF001 - what is looked up


# -- suffix decoding


def test_the_suffix_walk_follows_the_most_frequent_continuation_while_likely_enough() -> None:
    corpus = np.array([1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 3, 7])
    n, ends = longest_match(corpus, np.flatnonzero(corpus == 2), np.array([9, 1, 2]), max_depth=8)
    assert n == 2 and ends.tolist() == [1, 4, 7, 10]
    # 3 follows 3 of the 4 "1 2", then 1 follows 2 of those 3, 2 both, then 3 one of the 2: path probabilities .75,
    # .5, .5, .25, .25
    assert walk(corpus, ends, 5, 0.3) == ([3, 1, 2], pytest.approx(0.75 + 0.5 + 0.5))
    assert walk(corpus, ends, 5, 0.1) == ([3, 1, 2, 3, 1], pytest.approx(2.25))
    assert walk(corpus, ends, 2, 0.1)[0] == [3, 1]
    assert walk(corpus, ends, 5, 0.6)[0] == [3]


def test_the_suffix_match_and_walk_agree_with_plain_searches_on_random_corpora() -> None:
    """Single occurrences (followed without arrays) and many (counted with np.unique past a few) alike."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        alphabet = int(rng.integers(2, 6))
        corpus = rng.integers(-1, alphabet, size=int(rng.integers(2, 400)))  # -1: an output's end
        if rng.random() < 0.4:  # outputs that loop: every occurrence goes on alike, up to an output's end
            loop = rng.integers(0, alphabet, size=int(rng.integers(1, 4))).tolist()
            repeats = rng.integers(1, 9, size=4) if rng.random() < 0.5 else [int(rng.integers(1, 9))] * 4
            corpus = np.array([t for r in repeats for t in loop * int(r) + [-1]][: -int(rng.integers(1, 3))])
        pattern = np.concatenate([corpus[: int(rng.integers(1, len(corpus)))], rng.integers(0, alphabet, size=2)])
        candidates = np.flatnonzero(corpus == pattern[-1])
        max_depth = int(rng.integers(1, 12)) if rng.random() < 0.7 else 1  # 1: every occurrence of the last token
        max_drafts, min_prob = int(rng.integers(1, 9)), float(rng.random() / 2) if rng.random() < 0.8 else 0.0
        n, ends = longest_match(corpus, candidates, pattern, max_depth)
        assert (n, ends.tolist()) == _plain_match(corpus.tolist(), candidates.tolist(), pattern.tolist(), max_depth)
        if n:
            assert walk(corpus, ends, max_drafts, min_prob) == _plain_walk(corpus.tolist(), ends.tolist(), max_drafts,
                                                                           min_prob)


def _plain_match(corpus: list[int], candidates: list[int], pattern: list[int], max_depth: int
                 ) -> tuple[int, list[int]]:
    best: tuple[int, list[int]] = (0, [])
    for n in range(1, min(max_depth, len(pattern)) + 1):
        ends = [e for e in candidates if e >= n - 1 and corpus[e - n + 1 : e + 1] == pattern[-n:]]
        if not ends:
            break
        best = (n, ends)
    return best


def _plain_walk(corpus: list[int], ends: list[int], max_drafts: int, min_prob: float) -> tuple[list[int], float]:
    draft, probability, score = [], 1.0, 1.0
    while len(draft) < max_drafts:
        following = [e + 1 for e in ends if e + 1 < len(corpus) and corpus[e + 1] != -1]
        if not following:
            break
        counts = Counter(corpus[f] for f in following)
        token = min(counts, key=lambda t: (-counts[t], t))
        probability *= counts[token] / len(ends)
        if probability < min_prob:
            break
        draft.append(token)
        score += probability
        ends = [f for f in following if corpus[f] == token]
    return draft, score - 1.0


def test_the_output_cache_finds_tokens_in_recent_outputs_only() -> None:
    cache = OutputCache(max_requests=4, max_tokens=1000)
    for output in ([1, 2, 3], [4, 1], [5, 6]):
        cache.add(output)
    assert cache.positions_of(1).tolist() == [0, 5] and cache.corpus.tolist() == [1, 2, 3, -1, 4, 1, -1, 5, 6, -1]
    for i in range(3):  # past 4 requests the oldest go, a quarter at a time
        cache.add([20 + i])
    assert cache.positions_of(1).tolist() == [] and cache.positions_of(22).tolist() == [7]


def test_suffix_proposals_choose_the_likelier_corpus() -> None:
    proposer = SuffixProposer(max_depth=8, max_cached_requests=10, max_spec_factor=2.0, min_token_prob=0.1)
    done = Sequence("done", [9], SamplingParams(), max_tokens=10)
    done.token_ids += [5, 6, 7, 8, 5, 6, 7, 8]
    done.num_tokens = len(done.token_ids)
    proposer.on_finished(done)
    seq = Sequence("r", [5, 6, 1, 5, 6, 2, 5, 6], SamplingParams(), max_tokens=10)
    proposer.propose([seq], [4])
    # Earlier outputs: 7 follows both "5 6" (probabilities 1, 1, .5, .5); its own: 1 and 2 follow one each (.5, ...).
    assert seq.draft_token_ids == [7, 8, 5, 6]
    proposer.propose([seq], [1])
    assert seq.draft_token_ids == [7]
    alone = SuffixProposer(max_depth=8, max_cached_requests=10, max_spec_factor=2.0, min_token_prob=0.1)
    alone.propose([seq], [4])
    assert seq.draft_token_ids == [1, 5, 6, 2]


# -- the controller


def run_controller(times: dict[int, float], acceptance: list[float], batch_size: int = 1,
                   controller: DraftLengthController | None = None) -> DraftLengthController:
    """Drives a controller with the given step time per draft length and acceptance per position until every arm
    of the batch's bucket is measured."""
    controller = controller or DraftLengthController(max_drafts=4, refresh_steps=1000)
    for _ in range(12):
        k = controller.choose(batch_size)
        controller.observe_step(batch_size, k, times[k])
        if k:
            controller.observe_acceptance(100, [round(100 * r) for r in acceptance[:k]])
    return controller


def test_plain_then_the_longest_then_only_hopeful_lengths_are_tried() -> None:
    """The first step at a new length is not measured (it pays for, or skips, the wait of the previous one's step
    in flight), nor the second plain one (it waits for the first's device work): plain decoding runs three steps,
    the longest draft length two; a shorter length is tried only while the line between their times could make it
    the best."""
    controller = DraftLengthController(max_drafts=3)
    chosen = []
    for _ in range(9):
        chosen.append(controller.choose(8))
        controller.observe_step(8, chosen[-1], 0.01)
    assert chosen == [0, 0, 0, 3, 3, 3, 3, 3, 3]  # untried acceptance counts as full: the longest wins outright
    slow = DraftLengthController(max_drafts=3)
    for _ in range(30):
        k = slow.choose(8)
        assert k in (0, 3), "verifying three drafts took five plain steps: no shorter length could win"
        slow.observe_step(8, k, 0.05 if k else 0.01)
        if k:
            slow.observe_acceptance(8, [8, 8, 8])
    assert slow.choose(8) == 0


def test_a_change_of_length_is_not_measured() -> None:
    controller = run_controller({0: 1.0, 1: 1.5}, [0.6], controller=DraftLengthController(1, refresh_steps=1000))
    # k = 1 wins: 1.6 / 1.5 > 1 / 1.0
    assert controller.choose(1) == 1
    controller.observe_step(1, 0, 100.0)  # a plain step after verifying ones (say, a refresh): not counted
    controller.observe_step(1, 1, 100.0)  # back: not counted either
    assert controller.choose(1) == 1


def test_a_step_with_prompt_tokens_gets_no_drafts_and_is_not_measured() -> None:
    controller = run_controller({0: 1.0, 1: 1.5}, [0.6], controller=DraftLengthController(1, refresh_steps=1000))
    assert controller.choose(1) == 1
    assert controller.choose(1, lambda: True) == 0
    controller.observe_step(0, 0, 100.0)  # that step: not measured
    controller.observe_step(1, 1, 100.0)  # the next waited for its device work: not measured either
    assert controller.choose(1) == 1
    controller.observe_step(1, 1, 100.0)  # from the second on, verifying steps are measured again
    assert controller.choose(1) == 0


@pytest.mark.parametrize(("times", "acceptance", "best"), [
    ({0: 1.0, 1: 1.1, 2: 1.1, 3: 1.1, 4: 1.1}, [0.8, 0.6, 0.4, 0.2], 4),  # verifying is nearly free: all drafts
    ({0: 1.0, 1: 1.4, 2: 1.8, 3: 2.2, 4: 2.6}, [0.8, 0.6, 0.4, 0.2], 2),  # each draft costs: up to where it pays
    ({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0}, [0.8, 0.6, 0.4, 0.2], 0),  # a loaded batch: never speculate
    ({0: 1.0, 1: 1.05, 2: 1.1, 3: 1.15, 4: 1.2}, [0.0, 0.0, 0.0, 0.0], 0),  # no draft is ever accepted
])
def test_the_best_measured_rate_wins(times: dict[int, float], acceptance: list[float], best: int) -> None:
    controller = run_controller(times, acceptance)
    assert controller.choose(1) == best


def test_each_batch_size_bucket_has_its_own_costs() -> None:
    acceptance = [0.9, 0.8, 0.7, 0.6]
    controller = run_controller({0: 1.0, 1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4}, acceptance, batch_size=1)
    run_controller({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0}, acceptance, batch_size=200, controller=controller)
    assert controller.choose(1) == 4
    assert controller.choose(150) == 0  # 150 and 200 share the bucket of 256


def refreshes(times: dict[int, float], acceptance: float, num_steps: int) -> str:
    """The draft lengths (as digits) a measured controller of max_drafts 1 and refresh_steps 10 chooses over
    `num_steps` steps of these costs."""
    controller = DraftLengthController(max_drafts=1, refresh_steps=10)
    run_controller(times, [acceptance], controller=controller)
    chosen = ""
    for _ in range(num_steps):
        k = controller.choose(1)
        chosen += str(k)
        controller.observe_step(1, k, times[k])
        if k:
            controller.observe_acceptance(100, [round(100 * acceptance)])
    return chosen


def test_a_losing_arm_is_refreshed_as_often_as_its_cost_allows() -> None:
    """A refresh runs two steps at k = 1 (the first not measured), then two unmeasured plain steps. One that gives
    up a quarter of its two steps' tokens (rate 0.75 against 1.0: 1.0 of time) waits until it costs 1% of the
    steps' time: 100 measured steps; one that gives up 5% of them (0.1 of time) every 10."""
    far = refreshes({0: 1.0, 1: 2.0}, 0.5, 400)
    assert re.fullmatch(r"0*11(0+11)+0*1?", far), far
    assert {len(run) for run in far.strip("0").split("11") if run} == {101}, far
    near = refreshes({0: 1.0, 1: 1.1}, 0.05, 100)
    assert {len(run) for run in near.strip("0").split("11")[1:-1]} == {12}, near


def test_a_refreshed_arm_can_take_over() -> None:
    controller = DraftLengthController(max_drafts=1, refresh_steps=10)
    run_controller({0: 1.0, 1: 2.0}, [0.5], controller=controller)
    for _ in range(100):  # verifying became cheap (say, the batch around it emptied): the refreshed figure wins
        k = controller.choose(1)
        controller.observe_step(1, k, 1.0 if k == 0 else 1.05)
        if k:
            controller.observe_acceptance(1, [1])
    assert controller.choose(1) == 1


def run_with_prompts(decode_steps_per_prompt: int, num_prompts: int, entry: float = 3.0,
                     exit_cost: float = 0.0) -> list[int]:
    """The draft lengths a controller chooses where a prompt step comes every `decode_steps_per_prompt` decode steps;
    verifying steps take 1.5 against plain ones' 1.0 and accept 0.6 drafts (a gain of 7% in a run of them), but the
    first verifying step after a plain step or a prompt takes `entry` more (it waits for the step in flight), after a
    prompt any step takes 1.0 more, and a prompt step (5.0) after a verifying one `exit_cost` more."""
    controller = DraftLengthController(max_drafts=1, refresh_steps=1000)
    chosen, previous = [], 0
    for _ in range(num_prompts):
        controller.observe_step(0, 0, 5.0 + (exit_cost if previous > 0 else 0.0))
        previous = -1
        for _ in range(decode_steps_per_prompt):
            k = controller.choose(1)
            chosen.append(k)
            seconds = 1.5 if k else 1.0
            seconds += entry if k and previous != k else 0.0
            seconds += 1.0 if previous == -1 else 0.0
            controller.observe_step(1, k, seconds)
            if k:
                controller.observe_acceptance(5, [3])
            previous = k
    return chosen


def test_entering_verification_is_charged_over_the_runs_between_prompts() -> None:
    """With a prompt every 4 decode steps each run would pay the entry (3.0) for at most 4 x 0.07 of gain: plain
    decoding wins; with one every 200 the entry is spread thin and verification wins."""
    short_runs = run_with_prompts(4, 60)
    assert sum(short_runs[-120:]) == 0, short_runs
    long_runs = run_with_prompts(200, 3)
    assert sum(long_runs[-150:]) >= 140, long_runs


def test_leaving_verification_for_a_prompt_is_charged_as_entering_it() -> None:
    """Entering is free but a prompt step after a verifying one takes 2.0 more (laid out once the verifying step's
    result is back, the device idle): with a prompt every 8 decode steps a run gains at most 8 x 0.07 against it, so
    plain decoding wins once a run has ended in each way; with one every 200, verification still wins."""
    short_runs = run_with_prompts(8, 60, entry=0.0, exit_cost=2.0)
    assert sum(short_runs[-240:]) == 0, short_runs
    assert sum(run_with_prompts(8, 60, entry=0.0)[-240:]) >= 200  # without the exit's cost verification wins there
    long_runs = run_with_prompts(200, 3, entry=0.0, exit_cost=2.0)
    assert sum(long_runs[-150:]) >= 140, long_runs


def controller_after_runs_that_leave_verification(leave: float) -> DraftLengthController:
    """Runs between prompts of 4 plain steps (1.0), 12 verifying ones (1.5, 0.6 drafts accepted) and 4 plain ones,
    the first two of which take `leave` more in all (the first books the verifying step, the device idle); then a
    run that verifies as acceptance falls to 0.47."""
    controller = DraftLengthController(max_drafts=1, refresh_steps=10**6)
    for is_whole in (True, True, True, False):
        controller.observe_step(0, 0, 5.0)
        for _ in range(4):
            controller.observe_step(1, 0, 1.0)
        for _ in range(12 if is_whole else 6):
            controller.observe_step(1, 1, 1.5)
            controller.observe_acceptance(10, [6])
        for i in range(4 if is_whole else 0):
            controller.observe_step(1, 0, 1.0 + (leave / 2 if i < 2 else 0.0))
    for _ in range(40):
        controller.observe_acceptance(100, [47])
    return controller


def test_leaving_verification_for_plain_decoding_is_charged_as_entering_it() -> None:
    """Where verifying has fallen just below plain decoding (1.47 tokens for 1.5 against 1.0 for 1.0), a controller
    that measured leaving it as costing 2.0 (spread over a run of about 27 tokens) keeps verifying; one that measured
    it free leaves."""
    assert controller_after_runs_that_leave_verification(leave=2.0).choose(1) == 1
    assert controller_after_runs_that_leave_verification(leave=0.0).choose(1) == 0


def controller_after_verifying_runs(num_verifying: int) -> DraftLengthController:
    """One sequence, a prompt every 200 tokens or so; within, runs of 4 plain steps (1.0) and `num_verifying`
    verifying ones (1.5, 0.6 drafts accepted), the first of which takes 3.0 more (it waits for the step in flight)."""
    controller = DraftLengthController(max_drafts=1, refresh_steps=10**6)
    for _ in range(3):
        controller.observe_step(0, 0, 5.0)
        tokens = 0.0
        while tokens < 200:
            for _ in range(4):
                controller.observe_step(1, 0, 1.0)
            for i in range(num_verifying):
                controller.observe_step(1, 1, 1.5 + (3.0 if i == 0 else 0.0))
                controller.observe_acceptance(1, [1 if i % 5 < 3 else 0])
            tokens += 4 + 1.6 * num_verifying
    controller.observe_step(0, 0, 5.0)
    for _ in range(4):
        controller.observe_step(1, 0, 1.0)
    for _ in range(40):
        controller.observe_acceptance(10, [6])
    return controller


def test_entering_verification_is_charged_over_the_verifying_runs_where_they_end_before_the_prompt() -> None:
    """Verifying (1.6 tokens for 1.5 against 1.0 for 1.0) gains 7% in a run of it: where its runs last 5 steps (8
    tokens) each entry (3.0) costs more than that, and from plain decoding the controller stays there, though the
    prompts come 200 tokens apart; where they last 100 steps it enters."""
    assert controller_after_verifying_runs(5).choose(1) == 0
    assert controller_after_verifying_runs(100).choose(1) == 1


def controller_after_short_verifying_runs(leave: float) -> DraftLengthController:
    """One sequence after its prompt: runs of 10 plain steps (1.0) and 3 verifying ones (1.15, the first unmeasured),
    the first two plain steps after them taking `leave` more in all; then plain steps whose lookups accept one draft
    in five (1.2 tokens for 1.15 against 1.0 for 1.0: a gain of 4% a step, were it free to go back)."""
    controller = DraftLengthController(max_drafts=1, refresh_steps=10**6)
    controller.observe_step(0, 0, 5.0)
    for _ in range(6):
        for i in range(10):
            controller.observe_step(1, 0, 1.0 + (leave / 2 if i < 2 else 0.0))
        for _ in range(3):
            controller.observe_step(1, 1, 1.15)
            controller.observe_acceptance(1, [0])
    for i in range(10):
        controller.observe_step(1, 0, 1.0 + (leave / 2 if i < 2 else 0.0))
    for _ in range(40):
        controller.observe_acceptance(5, [1])
    return controller


def test_entering_verification_is_charged_the_way_back_to_plain_decoding() -> None:
    """From plain decoding, verifying 4% faster a step does not pay for runs of 3 steps (about 3.3 tokens, as expected
    when they ran) that each cost 0.6 to leave again: the controller stays plain; where leaving is free, it enters."""
    assert controller_after_short_verifying_runs(leave=0.6).choose(1) == 0
    assert controller_after_short_verifying_runs(leave=0.0).choose(1) == 1


def test_a_run_past_twice_the_expected_one_verifies_again() -> None:
    """A first run of 6 decode steps (a warm-up request) ends verifying, so the exit after a plain step is unmeasured
    and the next run holds plain decoding where it is expected to end (about 9 tokens in) so that its prompt comes
    after a plain step; that run goes on for 200 steps (the next request is longer), and once past twice the expected
    length it verifies again (1.9 tokens for 1.2 against 1.0 for 1.0), not plain to its end."""
    controller = DraftLengthController(max_drafts=1, refresh_steps=10**6)
    chosen: list[int] = []
    for num_steps in (6, 200):
        controller.observe_step(0, 0, 5.0)
        chosen.clear()
        for i in range(num_steps):
            k = controller.choose(1)
            chosen.append(k)
            controller.observe_step(1, k, 1.2 if k else 1.0)
            if k:
                controller.observe_acceptance(1, [int(i % 10 < 9)])
        if num_steps == 6:
            assert chosen[-1] == 1, chosen  # the first run ended verifying
    assert 0 in chosen[3:12] and sum(chosen[-150:]) >= 145, chosen


def test_runs_are_counted_in_tokens_per_bucket() -> None:
    """Runs alternate between one sequence, whose prompt comes every 200 tokens, and 16, whose prompts come every 8
    tokens (a request ends after so many tokens, faster where drafts are accepted); a prompt step after a verifying one
    costs 3.0 more at both. Verification (1.6 tokens for 1.5 against 1.0 for 1.0) pays where runs are long only: each
    bucket weighs the exit against its own runs."""
    controller = DraftLengthController(max_drafts=1, refresh_steps=1000)
    chosen: dict[int, list[int]] = {1: [], 16: []}
    previous = 0
    for _ in range(40):
        for batch_size, run_tokens in ((1, 200), (16, 8)):
            controller.observe_step(0, 0, 5.0 + (3.0 if previous > 0 else 0.0))
            previous, tokens = -1, 0.0
            while tokens < run_tokens:
                k = controller.choose(batch_size)
                chosen[batch_size].append(k)
                controller.observe_step(batch_size, k, 1.5 if k else 1.0)
                if k:
                    controller.observe_acceptance(5, [3])
                tokens += 1.6 if k else 1.0
                previous = k
    assert sum(chosen[1][-1000:]) >= 950, chosen[1]
    assert sum(chosen[16][-100:]) == 0, chosen[16]


def test_one_slow_plain_step_does_not_turn_speculation_on() -> None:
    """A plain step slowed by something else (a garbage collection) enters the plain arm's average at most 1.5 times
    that average: without the cap, one 20-unit step makes drafts that are never accepted look worth verifying, and
    the plain arm would be measured again only at refreshes."""
    controller = run_controller({0: 1.0, 1: 1.6}, [0.0], controller=DraftLengthController(1, refresh_steps=1000))
    assert controller.choose(1) == 0
    controller.observe_step(1, 0, 20.0)
    assert controller.choose(1) == 0
    for _ in range(20):  # a lasting change of cost still comes through, a step at a time
        controller.observe_step(1, 0, 3.0)
    assert controller.choose(1) == 1


def test_a_verifying_arms_slow_steps_count_in_its_cost() -> None:
    """Verifying steps' slow steps are theirs (each waits for its own result): one of 10 units enters the arm's
    average capped (1.5 -> 1.65) and its excess over the cap (7.75) the arm's tail average at weight 0.05, a cost of
    2.04 where plain decoding's 1.0 per token wins; capped alone it would stay at 1.65 and keep verifying."""
    controller = run_controller({0: 1.0, 1: 1.5}, [0.9], controller=DraftLengthController(1, refresh_steps=1000))
    assert controller.choose(1) == 1
    controller.observe_step(1, 1, 10.0)
    assert controller.choose(1) == 0


def test_an_arms_first_steps_are_averaged_evenly() -> None:
    """An arm's first measured steps are averaged as equals (then a running average): one sample must not stand for
    an arm that is measured again only at refreshes."""
    controller = DraftLengthController(max_drafts=1)
    for seconds in (9.0, 9.0, 1.0, 1.2, 1.4):  # two unmeasured plain steps, then three measured ones
        controller.observe_step(1, 0, seconds)
    assert controller._bucket(1).arms[0].seconds == pytest.approx(1.2)  # noqa: SLF001 - the figure itself


def test_acceptance_is_the_mean_of_its_first_samples() -> None:
    """A reply's opening that no draft predicts (nothing accepted at the first verifying steps) must not stand for
    the acceptance while only refreshes measure it again: the first samples are averaged as equals."""
    controller = DraftLengthController(max_drafts=2)
    for accepted in ([0, 0], [1, 1], [1, 0], [1, 1]):
        controller.observe_acceptance(1, accepted)
    assert controller.expected_tokens(2) == pytest.approx(1.0 + 0.75 + 0.5)



@pytest.mark.parametrize(("batch_size", "expected"), [(1, 1.0), (2, 1.8)])
def test_a_prompt_after_one_sequences_run_averages_acceptance_afresh(batch_size: int, expected: float) -> None:
    """After a run of one sequence its reply's acceptance (here high) does not stand for the next reply's: the first
    sample after the prompt step replaces it. After a run of several sequences the running average goes on."""
    controller = DraftLengthController(max_drafts=1)
    for _ in range(20):
        controller.observe_acceptance(1, [1])
    controller.observe_step(batch_size, 1, 0.001)
    controller.observe_step(0, 0, 0.002)  # the next request's prompt
    controller.observe_acceptance(1, [0])
    assert controller.expected_tokens(1) == pytest.approx(expected)

# -- blocks of rejected drafts


def test_blocks_past_the_kept_tokens_are_freed() -> None:
    bm = BlockManager([KVCacheGroup(None, 8)], block_size=4)
    seq = Sequence("r", list(range(6)), SamplingParams(), max_tokens=20)
    bm.admit(seq, bm.no_hit())
    bm.allocate(seq, 6)
    seq.num_computed_tokens = 5
    bm.allocate(seq, 1 + 4)  # the last token and four drafts: tokens 5..9, blocks for 10 tokens
    assert seq.block_tables == [[0, 1, 2]]
    assert bm.pools[0].block_keys[1] is None  # the block holding drafts is not keyed
    bm.release_tail(seq, 7)  # one draft accepted: tokens 0..6 computed
    assert seq.block_tables == [[0, 1]] and list(bm.pools[0].free_ids) == [3, 4, 5, 6, 7, 2]
    bm.free(seq)
    assert bm.num_used_blocks == 0


def test_rejected_drafts_free_their_blocks_in_every_group_and_keep_the_window() -> None:
    """A windowed group releases only the blocks before the window of the step's first position (which every
    verified position still sees), and gives back its rejected drafts' blocks as the full group does."""
    bm = BlockManager([KVCacheGroup(None, 8), KVCacheGroup(6, 8)], block_size=4)  # a query at p sees p - 5 .. p
    seq = Sequence("r", list(range(14)), SamplingParams(), max_tokens=20)
    bm.admit(seq, bm.no_hit())
    bm.allocate(seq, 14)
    seq.num_computed_tokens = 13
    bm.allocate(seq, 1 + 4)  # tokens 13..17: position 13 sees 8..13, so windowed blocks 0 and 1 go
    assert seq.block_tables == [[0, 1, 2, 3, 4], [8, 8, 2, 3, 4]]
    assert list(bm.pools[1].evictable_ids) == [0, 1]  # keyed: a later prompt may hit them
    bm.release_tail(seq, 15)  # one draft accepted: tokens 0..14 computed, position 15 next (it sees 10..15)
    assert seq.block_tables == [[0, 1, 2, 3], [8, 8, 2, 3]]
    assert [bm.pools[1].ref_counts[b] for b in (2, 3)] == [1, 1]
    assert list(bm.pools[0].free_ids)[-1] == 4 and list(bm.pools[1].free_ids)[-1] == 4
    bm.free(seq)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks + bm.num_evictable_blocks == 16


# -- verification's distribution


def test_verification_draws_from_the_targets_distribution() -> None:
    """One-hot drafts verified by sampling each position: the first token is distributed as the target's p0
    (the draft accepted with probability p0(draft), else a draw from p0 without it, renormalized), and the token
    after an accepted draft as p1. A chi-square test at 0.1% on 20000 sequences with a fixed seed."""
    p0 = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.02, 0.08, 0.15, 0.05])
    p1 = torch.tensor([0.20, 0.05, 0.05, 0.30, 0.10, 0.10, 0.15, 0.05])
    num_seqs, draft = 20000, 3
    batch = Batch(token_ids=[0] * 2 * num_seqs, positions=[0, 1] * num_seqs, slot_mapping=[0] * 2 * num_seqs,
                  query_lens=[2] * num_seqs, context_lens=[2] * num_seqs, block_tables=[[0]] * num_seqs,
                  sampling=[RowSampling(temperature=1.0)] * num_seqs, num_draft_tokens=[1] * num_seqs)
    rows, token_indices = batch.sampled_positions()
    assert len(rows) == 2 * num_seqs and token_indices.tolist()[:4] == [0, 1, 2, 3]
    logits = torch.stack([p0.log(), p1.log()] * num_seqs)
    sampled = Sampler(torch.device("cpu"), seed=0)(logits, rows).token_ids
    speculation = Speculation(SpeculativeConfig(num_speculative_tokens=1), max_model_len=16)
    firsts, seconds = [], []
    for i in range(num_seqs):
        pair = sampled[2 * i : 2 * i + 2]
        kept = pair[: speculation.num_accepted(pair, [draft]) + 1]
        firsts.append(kept[0])
        if len(kept) == 2:
            seconds.append(kept[1])
    def p_value(tokens: list[int] | np.ndarray, p: np.ndarray) -> float:
        counts = np.bincount(tokens, minlength=len(p))
        return chisquare(counts, p / p.sum() * counts.sum()).pvalue

    first_p, second_p = p0.double().numpy(), p1.double().numpy()
    assert p_value(firsts, first_p) > 1e-3
    assert p_value(seconds, second_p) > 1e-3
    assert speculation.counts.num_accepted_tokens == firsts.count(draft) == len(seconds)
    rejected = [t - (t > draft) for t in firsts if t != draft]  # the other tokens, renumbered without the draft
    assert p_value(rejected, np.delete(first_p, draft)) > 1e-3
    # A wrong rule fails the same test: accepting the draft half the time, whatever p0 says.
    assert p_value(np.where(np.arange(num_seqs) % 2 == 0, draft, firsts), first_p) < 1e-3


# -- metrics


def test_metrics_are_served_as_vllms_when_speculating() -> None:
    zeros = [0] * len(EngineStats.__dataclass_fields__)
    stats = EngineStats(*zeros[:11], num_spec_drafts=5, num_spec_draft_tokens=12, num_spec_accepted_tokens=7,
                        num_spec_accepted_per_position=(4, 2, 1))
    text = ServerMetrics("m", 2048, lambda: stats, lambda: 0).exposition().decode()
    assert 'openai_serve:spec_decode_num_drafts_total{model_name="m"} 5.0' in text
    assert 'openai_serve:spec_decode_num_draft_tokens_total{model_name="m"} 12.0' in text
    assert 'openai_serve:spec_decode_num_accepted_tokens_total{model_name="m"} 7.0' in text
    assert 'openai_serve:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 1.0' in text
    plain = EngineStats(*zeros[:11])
    assert "spec_decode" not in ServerMetrics("m", 2048, lambda: plain, lambda: 0).exposition().decode()
