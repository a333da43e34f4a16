"""The evolutionary search proposes distinct, unmeasured members of the space, best first."""

import math
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from conftest import scaled_relu_matmul

from eqsched.backend import CompileOptions, compile_program
from eqsched.egraph.space import Space, build_space
from eqsched.egraph.term import BlockRef, Cached, symbols, walk
from eqsched.expr import Const
from eqsched.extract import Candidate, CostModel, EvolutionarySearch, get_cost_model
from eqsched.extract.analytic import AnalyticModel
from eqsched.extract.search import (
    TWINS_MEASURED,
    _splits_exactly,
    _with_every_sketch,
    unrolled_copies,
)
from eqsched.ir import Block, Loop, LoopKind, naive_program, parallel_nest
from eqsched.ir import walk as walk_nodes
from eqsched.model import extract_tasks, get_model
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.rules import default_rules, resolve
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload


class FewestScalarIterations(CostModel):
    """Prefers programs whose innermost work is vectorized: iterations not covered by a vector
    loop, summed over the blocks `counts` keeps (all of them here)."""

    name = "test-scalar-iterations"

    def predict(self, programs):
        out = []
        for prog in programs:
            total = 0
            for blk in filter(self.counts, prog.blocks()):
                loops = prog.enclosing(blk.name)
                n = 1
                for lp in loops:
                    n *= 1 if lp.kind == LoopKind.VECTOR else lp.extent
                total += n
            out.append(float(total))
        return np.array(out)

    def counts(self, blk):
        return True


@pytest.fixture(scope="module")
def space():
    return build_space(naive_program(get_workload("matmul").build(16, 32, 8)), default_rules())


def test_proposals_are_distinct_members_best_first(space):
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=1, population=24,
                                generations=2, random_fraction=0)
    batch = search.propose(6)
    assert len(batch) == 6
    assert len({c.hash for c, _ in batch}) == 6
    predicted = [p for _, p in batch]
    assert predicted == sorted(predicted)
    for cand, _ in batch:
        assert space.contains(cand.term, cand.sizes)


def test_the_model_steers_the_search(space):
    guided = EvolutionarySearch(space, FewestScalarIterations(), seed=2, population=24,
                                generations=2, random_fraction=0)
    best = guided.propose(1)[0][0]
    model = FewestScalarIterations()
    randoms = [EvolutionarySearch(space, model, seed=s).random_candidate() for s in range(10)]
    scores = model.predict([c.program for c in randoms])
    assert model.predict([best.program])[0] <= scores.min()
    assert any(lp.kind == LoopKind.VECTOR for lp in best.program.loops())


def test_measured_programs_are_not_proposed_again(space):
    search = EvolutionarySearch(space, get_cost_model("random", seed=0), seed=3, population=16,
                                generations=1)
    first = {c.hash for c, _ in search.propose(5)}
    second = {c.hash for c, _ in search.propose(5, exclude=first)}
    assert first.isdisjoint(second)


def test_the_same_seed_proposes_the_same_programs(space):
    def run(seed):
        search = EvolutionarySearch(space, FewestScalarIterations(), seed=seed, population=16,
                                    generations=2)
        return [c.hash for c, _ in search.propose(4)] + [c.hash for c, _ in search.propose(4)]

    assert run(7) == run(7)


def test_the_search_takes_turns_and_proposes_the_same_programs(space):
    turns = []

    def run(wait_turn):
        search = EvolutionarySearch(space, FewestScalarIterations(), seed=5, population=16,
                                    generations=2, wait_turn=wait_turn)
        return [c.hash for c, _ in search.propose(4)]

    assert run(lambda: turns.append(1)) == run(None)
    assert len(turns) > 16  # at least once per realization and per batch of predictions


class Renumbered:
    """The same saturation with its e-classes numbered the other way round: egglog numbers
    classes differently from one process to the next."""

    def __init__(self, sat):
        data = sat.serialized()
        classes = sorted({n["eclass"] for n in data["nodes"].values()})
        rename = dict(zip(classes, reversed(classes)))
        nodes = {nid: {**n, "eclass": rename[n["eclass"]]} for nid, n in data["nodes"].items()}
        self._data = {**data, "nodes": nodes}
        self.naive, self.facts, self.report = sat.naive, sat.facts, sat.report
        self.root_class = rename[sat.root_class]

    def serialized(self):
        return self._data


def test_proposals_do_not_depend_on_how_egglog_numbers_classes(space):
    def run(space):
        search = EvolutionarySearch(space, FewestScalarIterations(), seed=9, population=16,
                                    generations=3)
        return [c.hash for c, _ in search.propose(4)] + [c.hash for c, _ in search.propose(4)]

    assert run(space) == run(Space(Renumbered(space.saturation)))


# A first round of the search in a fresh interpreter: the space of matmul 16x24x8 (24 takes
# remainder splits), ranked by the analytic model. Prints the proposals' hashes.
PROPOSE_IN_A_FRESH_PROCESS = """
from eqsched.egraph.space import build_space
from eqsched.extract import EvolutionarySearch, get_cost_model
from eqsched.ir import naive_program
from eqsched.rules import default_rules
from eqsched.te import Computation, compute, placeholder, reduce_axis, sum_
from eqsched.workloads import get_workload

space = build_space(naive_program(get_workload("matmul").build(16, 24, 8)), default_rules())
search = EvolutionarySearch(space, get_cost_model("analytic"), seed=0, population=16,
                            generations=1, max_generations=1)
print(" ".join(c.hash for c, _ in search.propose(4)))
"""


def test_proposals_do_not_depend_on_pythons_string_hashing():
    # Sets of strings iterate in an order that changes from one process to the next
    # (PYTHONHASHSEED): batch workers and Ray tasks must propose what one process would.
    def proposals(hash_seed: str) -> list[str]:
        done = subprocess.run([sys.executable, "-c", PROPOSE_IN_A_FRESH_PROCESS],
                              env={**os.environ, "PYTHONHASHSEED": hash_seed},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    first = proposals("1")
    assert len(first) == 4 and proposals("2") == first


def test_mutants_are_members_that_compute_the_right_result(space):
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=4)
    comp = space.naive.computation
    inputs = random_inputs(comp, 0)
    expected = reference(comp, inputs)
    parent = search.random_candidate()
    checked = 0
    for _ in range(30):
        child = search.mutate(parent)
        if child is None:
            continue
        assert space.contains(child.term, child.sizes)
        if checked < 5:
            outputs = compile_program(child.program).run(inputs)
            ok, _, message = compare(outputs, expected, tolerance(comp))
            assert ok, message
            checked += 1
        parent = child
    assert checked == 5


@pytest.fixture(scope="module")
def chain():
    return build_space(naive_program(get_workload("mm_exp_mm").build(8, 16, 8, 16)),
                       default_rules())


def test_a_crossover_child_is_one_parent_with_a_shared_statement_of_the_other(chain):
    # A pair two choices apart whose children are not all one of them: most pairs of this
    # space differ outside a statement both share, and then each child is a parent.
    for seed in range(100):
        search = EvolutionarySearch(chain, FewestScalarIterations(), seed=seed)
        a = search.random_candidate()
        b = search.mutate(a)
        b = b and search.mutate(b)
        if b is not None and any(c is not None and c.hash not in (a.hash, b.hash)
                                 for c in (search.crossover(a, b) for _ in range(10))):
            break
    else:
        raise AssertionError("no pair of candidates has a child that is neither parent")
    comp = chain.naive.computation
    inputs = random_inputs(comp, 0)
    expected = reference(comp, inputs)
    mixed = 0
    for _ in range(40):
        child = search.crossover(a, b)
        if child is None or child.hash in (a.hash, b.hash):
            continue
        assert chain.contains(child.term, child.sizes)
        took = [all(child.picks.get(slot) == b.picks[slot] for slot in slots)
                for slots, _ in b.statements]
        assert any(took)
        if mixed < 3:
            outputs = compile_program(child.program).run(inputs)
            ok, _, message = compare(outputs, expected, tolerance(comp))
            assert ok, message
        mixed += 1
    assert mixed >= 3


def test_a_candidate_carries_its_trace_derived_once(space, monkeypatch):
    import eqsched.extract.search as search_module

    calls = []
    real_derive = search_module.derive

    def counting_derive(*args):
        calls.append(args)
        return real_derive(*args)

    monkeypatch.setattr(search_module, "derive", counting_derive)
    cand = EvolutionarySearch(space, FewestScalarIterations(), seed=6).random_candidate()
    assert cand.hash != space.naive.hash()
    assert cand.trace is cand.trace and len(calls) == 1
    assert Schedule.replay(space.naive, cand.trace).program.hash() == cand.hash


def test_a_draw_over_the_unrolling_limit_keeps_its_sizes_and_unrolls_less(space):
    # Random re-sizes rarely get under a tight limit (a ResNet block's conv task, whose four
    # statements all unroll, had no buildable draw under 128 copies and was never tuned); the
    # draw then keeps its sizes and makes unrolled loops serial until it fits.
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=0, max_unrolled=4,
                                max_attempts=2)
    drawn = [c for c in (search.random_candidate() for _ in range(10)) if c is not None]
    assert len(drawn) >= 8  # a draw may still be unbuildable, or its tile's copy nests too long
    assert all(unrolled_copies(c.program) <= 4 for c in drawn)
    assert all(space.contains(c.term, c.sizes) for c in drawn)


@pytest.fixture(scope="module")
def epilogue_space():
    """A dense layer's task: a matmul, then a bias and a ReLU that share its loops' groups."""
    model = get_model("mlp", batch=8, inputs=3, hidden=64, outputs=10)
    task = next(t for t in extract_tasks(model) if t.name == "matmul_add_relu")
    return build_space(naive_program(task.computation), default_rules())


def _unrolled_around(term, block):
    """The (group, path) of the unrolled loops around `block` in the term."""
    return next([(lp.group, lp.path) for lp in outer if lp.kind == LoopKind.UNROLL]
                for stmt, outer in walk(term.body) if stmt == BlockRef(block))


def test_an_epilogue_over_the_unrolling_limit_leaves_the_reductions_tile_its_sizes(
        epilogue_space):
    # A matmul whose 8 rows are unrolled around a vector loop, with the bias and the ReLU
    # unrolling the same piece in their own nests, over a limit that the matmul's copies alone
    # fit. Shrinking the shared group (the earlier repair) took the matmul's 8-row tile down
    # with the epilogue's copies; making unrolled loops serial keeps the sizes, and some of the
    # repairs keep the tile whole.
    space, rows, blocks = epilogue_space, 8, ("t0.init", "t0.update", "t1", "t2")
    parent = None
    for term, _ in space.sample(400, seed=0):
        inner = [outer[-1] for stmt, outer in walk(term.body) if stmt == BlockRef("t0.update")]
        shared = [s for s in _unrolled_around(term, "t0.update")
                  if s[0] == "t0.i0" and s in _unrolled_around(term, "t1")
                  and s in _unrolled_around(term, "t2")]
        plain = not term.packs and not any(isinstance(x, Cached) for x, _ in walk(term.body))
        if inner[0].kind == LoopKind.VECTOR and shared and plain:  # no copy nests to count
            parent = term, shared[0]
            break
    assert parent is not None
    term, (_, path) = parent
    tile = _unrolled_around(term, "t0.update")

    def copies(option, group):
        return math.prod(option[p] for g, p in tile if g == group)

    assignment = {}
    for group, options in space.size_options(term):
        if group == "t0.i0":
            options = [o for o in options if o[path] == rows]
        assignment[group] = min(options, key=lambda o: copies(o, group))
    sizes = {(g, p): e for g, paths in assignment.items() for p, e in paths.items()}
    tile_copies = math.prod(sizes[s] for s in tile)
    limit = tile_copies + len(blocks) - 1  # the tile and one copy of each other block
    assert rows <= tile_copies
    assert sum(math.prod(sizes[s] for s in _unrolled_around(term, b)) for b in blocks) > limit
    comp = space.naive.computation
    inputs = random_inputs(comp, 0)
    expected = reference(comp, inputs)
    kept = 0
    for seed in range(8):
        search = EvolutionarySearch(space, FewestScalarIterations(), seed=seed,
                                    max_unrolled=limit, max_attempts=0)
        child = search._grow(space.picks_for(term), assignment)
        assert child is not None and child.sizes == dict(sorted(sizes.items()))
        assert unrolled_copies(child.program) <= limit
        assert space.contains(child.term, child.sizes)
        kept += math.prod(sizes[s] for s in _unrolled_around(child.term, "t0.update")) \
            == tile_copies
        if seed == 0:
            outputs = compile_program(child.program).run(inputs)
            ok, _, message = compare(outputs, expected, tolerance(comp))
            assert ok, message
    assert kept >= 1


def test_no_proposal_unrolls_more_copies_than_the_limit(space):
    search = EvolutionarySearch(space, get_cost_model("random", seed=1), seed=5, population=24,
                                generations=2, max_unrolled=8)
    batch = search.propose(8)
    assert batch and all(unrolled_copies(c.program) <= 8 for c, _ in batch)


def test_egglog_extracts_the_smallest_term_and_the_baseline_sizes_it(space):
    from eqsched.extract.baseline import egglog_baseline, egglog_term

    term = egglog_term(space)
    assert space.contains(term, {s: space.facts.extents[s[0]] for s in symbols(term)})
    best = egglog_baseline(space, FewestScalarIterations(), k=2)
    assert best and all(c.term == term for c, _ in best)


class CountingRanks(CostModel):
    """Scores by a fixed function of the program, counting how many times it ranks a pool."""

    name = "test-counting"

    def __init__(self, score):
        self.score, self.calls = score, 0

    def predict(self, programs):
        self.calls += 1
        return np.array([self.score(p) for p in programs], dtype=float)


@pytest.fixture
def one_call_per_ranking(monkeypatch):
    """A ranking predicts its new programs in one call (not in batches), so that counting
    calls counts the rankings: one per population drawn and one per generation."""
    monkeypatch.setattr("eqsched.extract.search.PREDICTION_BATCH", 1_000_000)


@pytest.mark.usefixtures("one_call_per_ranking")
def test_a_round_stops_evolving_when_the_predicted_top_stops_gaining(space):
    flat = CountingRanks(lambda prog: 1.0)  # nothing ever gains
    EvolutionarySearch(space, flat, seed=0, population=12, generations=3,
                       max_generations=20, first_islands=1).propose(4)
    assert flat.calls == 1 + 3  # the first pool, then `generations` generations only


@pytest.mark.usefixtures("one_call_per_ranking")
def test_the_first_round_evolves_several_populations_and_later_rounds_one(space):
    flat = CountingRanks(lambda prog: 1.0)
    search = EvolutionarySearch(space, flat, seed=0, population=12, generations=3,
                                max_generations=20, survivors=4, first_islands=3)
    search.propose(4)
    assert flat.calls == 3 * (1 + 3)
    search.propose(4)  # starts from the survivors
    assert flat.calls == 3 * (1 + 3) + (1 + 3)


@pytest.mark.usefixtures("one_call_per_ranking")
def test_no_more_islands_once_the_best_is_predicted_fast_enough(space):
    flat = CountingRanks(lambda prog: 1.0)
    EvolutionarySearch(space, flat, seed=0, population=12, generations=3, max_generations=20,
                       first_islands=3, settled_s=1.0).propose(4)
    assert flat.calls == 1 + 3  # the first island's best (1 s) is already settled


@pytest.mark.usefixtures("one_call_per_ranking")
def test_a_round_evolves_past_its_generations_while_the_top_gains(space):
    # Every program scores by its text's hash: mutants keep finding lower scores for a while.
    gaining = CountingRanks(lambda prog: int(prog.hash()[:8], 16))
    EvolutionarySearch(space, gaining, seed=0, population=12, generations=1,
                       max_generations=6, first_islands=1).propose(4)
    assert 1 + 1 < gaining.calls <= 1 + 6


def test_a_space_with_nothing_buildable_proposes_nothing(space):
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=0, population=4,
                                max_attempts=2, max_unrolled=0)
    assert search.propose(3) == []



@pytest.fixture(scope="module")
def tiny_space():
    # Inlining and a parallel outer loop split nothing: 18 programs at any size.
    naive = naive_program(get_workload("elementwise_chain").build(31))
    return build_space(naive, resolve(["inline", "parallel"]))


def proposals_until_empty(search, k, rounds):
    """Every batch `search` proposes, excluding what it proposed before, until it proposes
    nothing or `rounds` batches were asked for."""
    tried, batches = set(), []
    for _ in range(rounds):
        batch = search.propose(k, exclude=tried)
        batches.append(batch)
        if not batch:
            break
        tried |= {c.hash for c, _ in batch}
    return batches


def test_a_small_space_is_ranked_whole_and_runs_out(tiny_space, within):
    total = tiny_space.count()
    model = FewestScalarIterations()
    search = EvolutionarySearch(tiny_space, model, seed=0, random_fraction=0)
    assert total < search.whole_space
    with within(60):
        batches = proposals_until_empty(search, 5, rounds=total)
    proposed = [c for batch in batches for c, _ in batch]
    assert len(proposed) == len({c.hash for c in proposed}) == total
    assert all(tiny_space.contains(c.term, c.sizes) for c in proposed)
    # Ranked whole, the first proposal is the model's best program of the space.
    everything = model.predict([c.program for c in search.every_candidate()])
    assert batches[0][0][1] == everything.min()
    assert [len(b) for b in batches[-2:]] == [total % 5 or 5, 0]
    assert search.exhausted == f"the space has {total} programs; all measured"


def test_a_population_larger_than_the_space_is_not_drawn_for_ever(tiny_space, within):
    # Evolved, not ranked whole: 64 distinct programs cannot be drawn from a space of 18.
    search = EvolutionarySearch(tiny_space, FewestScalarIterations(), seed=0, population=64,
                                generations=1, whole_space=0)
    with within(60):
        batches = proposals_until_empty(search, 4, rounds=tiny_space.count())
    proposed = [c.hash for batch in batches for c, _ in batch]
    assert proposed and len(proposed) == len(set(proposed)) <= tiny_space.count()
    assert batches[-1] == []
    assert search.exhausted.startswith("the search found no more untried programs among")


def test_fresh_draws_favour_tiles_that_split_a_power_of_two_exactly():
    # 64 also gains remainder tiles of 6, 12, 24 (register tiles of 3 x 2^a); drawn uniformly,
    # they outnumber the exact factorizations and a search rarely starts from whole tiles.
    sp = build_space(naive_program(get_workload("matmul").build(64, 64, 64)), default_rules())
    search = EvolutionarySearch(sp, FewestScalarIterations(), seed=0)
    draws = [search.random_candidate() for _ in range(200)]
    exact = [all(_splits_exactly(sizes, sp.facts.extents[group])
                 for group, sizes in c.assignment.items() if group in sp.facts.extents)
             for c in draws]
    assert sum(exact) >= 0.35 * len(draws)  # a uniform draw: about a fifth
    assert not all(exact)  # and remainder tiles are still drawn


def test_the_first_round_evolves_a_larger_population_than_later_ones(space):
    sizes: list[int] = []

    class Counting(FewestScalarIterations):
        def predict(self, programs):
            sizes.append(len(programs))
            return super().predict(programs)

    search = EvolutionarySearch(space, Counting(), seed=0, population=8, first_population=40,
                                survivors=8,
                                generations=1, max_generations=1, first_islands=1,
                                whole_space=0, random_fraction=0)
    first = search.propose(4)
    first_predicted, sizes[:] = sum(sizes), []
    search.propose(4, exclude=[c.hash for c, _ in first], elites=[c for c, _ in first])
    assert first_predicted >= 40 > sum(sizes)  # 40 fresh draws first; then 8 and their children


def test_only_a_chain_of_reductions_starts_from_a_doubled_population(space, chain):
    model = FewestScalarIterations()
    assert EvolutionarySearch(chain, model, population=8).first_population == 16
    assert EvolutionarySearch(space, model, population=8).first_population == 8
    assert EvolutionarySearch(space, model, population=8, first_population=24
                              ).first_population == 24


def test_the_repair_leaves_unrolled_a_loop_that_has_no_serial_form():
    # A dense layer's task at the course's size holds unrolled loops whose class has no serial
    # node (a rewrite built them unrolled); the repair of a draw over the unrolling limit
    # makes only loops with a serial form serial, so no draw fails to be repaired or refused.
    model = get_model("mlp")
    task = next(t for t in extract_tasks(model) if t.name == "matmul_add_relu")
    space = build_space(naive_program(task.computation), default_rules())
    alone = [n for nodes in space._nodes.values() for n in nodes
             if n.op == "loop" and n.literals[2] == LoopKind.UNROLL
             and not any(o.op == "loop" and o.children == n.children
                         and o.literals == (*n.literals[:2], LoopKind.SERIAL.value)
                         for o in nodes)]
    assert alone
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=0)
    drawn = [search.random_candidate() for _ in range(150)]
    assert all(c is None or c.program is not None for c in drawn)
    assert sum(c is not None for c in drawn) > 100


def _root_kinds(cand):
    return [stmt.kind for stmt in cand.term.body if hasattr(stmt, "kind")]


def _runs_right_on_two_threads(cand, space):
    comp = space.naive.computation
    inputs = random_inputs(comp, 0)
    outputs = compile_program(cand.program, CompileOptions(threads=2)).run(inputs)
    ok, _, message = compare(outputs, reference(comp, inputs), tolerance(comp))
    assert ok, message


def test_on_several_threads_a_candidate_is_completed_with_parallel_root_loops(space):
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=2, threads=2)
    completed = 0
    for _ in range(40):
        cand = search.random_candidate()
        if LoopKind.PARALLEL.value in _root_kinds(cand):
            continue
        child = search.parallelized(cand)
        if child is None:
            continue
        assert space.contains(child.term, child.sizes)
        assert child.sizes == cand.sizes  # the same tiles, only the root loops' kinds change
        assert LoopKind.PARALLEL.value in _root_kinds(child)
        for root in child.program.body:  # each parallel nest has steps to share
            if isinstance(root, Loop) and root.kind == LoopKind.PARALLEL:
                assert math.prod(lp.extent for lp in parallel_nest(root)) >= 2
        if completed < 3:
            _runs_right_on_two_threads(child, space)
        completed += 1
    assert completed >= 3


def test_a_batch_of_one_gives_way_to_the_loop_it_holds_to_run_in_parallel():
    row = build_space(naive_program(get_workload("matmul").build(1, 32, 8)), default_rules())
    search = EvolutionarySearch(row, FewestScalarIterations(), seed=0, threads=2)
    moved = 0
    for _ in range(40):
        cand = search.random_candidate()
        first = cand.term.body[0]
        if first.group != "C.i" or first.kind == LoopKind.PARALLEL.value:
            continue
        child = search.parallelized(cand)
        if child is None or child.term.body[0] == first:  # another nest made parallel
            continue
        top = child.term.body[0]
        assert top.kind == LoopKind.PARALLEL.value
        if top.group != "C.i":  # moved out past the batch loop
            assert [stmt.group for stmt in top.body] == ["C.i"]
        else:  # or run in parallel with it, when its steps do not divide among the threads
            nest = parallel_nest(child.program.body[0])
            assert len(nest) >= 2 and math.prod(lp.extent for lp in nest) >= 2
        _runs_right_on_two_threads(child, row)
        moved += 1
    assert moved >= 1


def test_a_root_loop_whose_steps_do_not_divide_among_the_threads_shares_them_with_another():
    # E.g. 16 rows in 3 steps of 6 (the last has 4): one core would run 2 of them. The twin
    # moves a loop under the root loop and runs the two in parallel: 3 x 2 steps, 3 a core.
    mm = build_space(naive_program(get_workload("matmul").build(16, 8, 4)), default_rules())
    search = EvolutionarySearch(mm, FewestScalarIterations(), seed=0, threads=2)
    two = AnalyticModel(threads=2)
    collapsed = 0
    for _ in range(400):
        cand = search.random_candidate()
        root = cand.program.body[-1]
        if not isinstance(root, Loop) or root.extent < 3 or root.extent % 2 == 0 \
                or parallel_nest(root)[1:]:
            continue
        twin = search.parallelized(cand)
        nest = parallel_nest(twin.program.body[-1]) if twin is not None else ()
        if len(nest) < 2:
            continue
        assert mm.contains(twin.term, twin.sizes) and twin.sizes == cand.sizes
        assert nest[0].name == root.name
        assert two._share(nest[0]) < two._share(replace(root, kind=LoopKind.PARALLEL))
        if collapsed < 2:
            _runs_right_on_two_threads(twin, mm)
        collapsed += 1
    assert collapsed >= 2


class PrefersParallelRoots(FewestScalarIterations):
    """FewestScalarIterations, halved for a program with a parallel loop."""

    name = "test-parallel-roots"

    def predict(self, programs):
        base = super().predict(programs)
        return np.array([t / 2 if any(lp.kind == LoopKind.PARALLEL for lp in p.loops()) else t
                         for t, p in zip(base, programs)])


def test_a_round_on_two_threads_makes_parallel_twins_and_one_thread_makes_none(space):
    rounds = {}
    for threads in (1, 2):
        search = EvolutionarySearch(space, PrefersParallelRoots(), seed=3, population=24,
                                    generations=2, random_fraction=0, threads=threads)
        batch = search.propose(6)
        assert len(batch) == 6
        for cand, _ in batch:
            assert space.contains(cand.term, cand.sizes)
            assert LoopKind.PARALLEL.value in _root_kinds(cand)  # what the model prefers
        rounds[threads] = [t for t in search._parallel_twins.values() if t is not None]
    assert rounds[1] == []
    assert rounds[2] and all(space.contains(t.term, t.sizes) for t in rounds[2])


def test_every_member_of_a_two_thread_population_gets_its_parallel_twin(space):
    # Not only the parents: a serial program with a good tile ranks below parallel ones with
    # poor tiles, so it would never be a parent, and its twin would never be made.
    for seed in range(10):  # a population with more serial members than there are parents
        search = EvolutionarySearch(space, FewestScalarIterations(), seed=seed, population=24,
                                    survivors=4, generations=2, random_fraction=0, threads=2)
        ranked = search._evolve([], 6, {})
        if sum(LoopKind.PARALLEL.value not in _root_kinds(c) for c, _ in ranked) > 4:
            break
    else:
        pytest.fail("no seed of ten evolves more serial members than parents")
    twins = {t.hash for t in search._parallel_twins.values() if t is not None}
    assert all(c.hash in search._parallel_twins or c.hash in twins for c, _ in ranked)


def _vector_around(cand, block):
    prog = cand.program
    return [lp for lp in prog.enclosing(block) if lp.kind == LoopKind.VECTOR]


def test_a_vector_twin_vectorizes_the_innermost_loop_around_the_reduction(space):
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=4)
    made = 0
    for _ in range(60):
        cand = search.random_candidate()
        if _vector_around(cand, "C.update"):
            continue
        twin = search.vectorized(cand)
        if twin is None:
            continue
        assert space.contains(twin.term, twin.sizes)
        vector = _vector_around(twin, "C.update")
        if not vector:  # no vector loop fits there: the twin vectorized the init's nest alone
            assert _vector_around(twin, "C.init") and not _vector_around(cand, "C.init")
            continue
        assert vector[0] is twin.program.enclosing("C.update")[-1]
        assert vector[0].extent in space.vector_lanes
        if made < 3:
            _runs_right_on_two_threads(twin, space)
        made += 1
    assert made >= 3


def test_a_vector_twin_vectorizes_an_elementwise_nest_along_its_unit_stride_store():
    space = build_space(scaled_relu_matmul(8, 16, 8), default_rules())
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=3)

    def twin_of_a_scalar_nest_of_e_alone(cand):
        alone = [n for n in cand.program.body if isinstance(n, Loop)
                 and {b.name for b in _blocks_under(n)} == {"E"}]
        if not alone or _vector_around(cand, "E"):
            return []
        twin = search.vectorized(cand)
        assert twin is not None
        return [twin]

    made = 0
    for _, (twin,) in _drawn_with_twins(search, twin_of_a_scalar_nest_of_e_alone, draws=150):
        innermost = twin.program.enclosing("E")[-1]
        # E[i, j]: j is the store's unit stride, and its finest piece (E.j.3 of a split in
        # four: steps of one element) is the vector loop.
        pieces = [lp.name for lp in twin.program.enclosing("E") if lp.name.startswith("E.j")]
        assert innermost.kind == LoopKind.VECTOR
        assert innermost.name == max(pieces, key=lambda n: [int(p) for p in n.split(".")[2:]])
        assert innermost.extent in space.vector_lanes
        if made < 3:
            _runs_right_on_two_threads(twin, space)
        made += 1
    assert made >= 3


def test_a_vector_twin_vectorizes_an_elementwise_nest_fused_under_the_reduction_nest():
    # A ReLU fused under the matmul's outer loop (a residual add under a convolution's) loops
    # over whole rows of 24, no vector width: the twin splits the row (as the matmul splits j,
    # or in two), its finest piece the vector, and leaves the nest where it was.
    space = build_space(scaled_relu_matmul(8, 24, 8), default_rules())
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=3)

    def fused_e_alone(prog):
        return [n for n in prog.body if isinstance(n, Loop)
                and {"E", "C.update"} <= {b.name for b in _blocks_under(n)}]

    def twin_of_a_scalar_fused_e(cand):
        if not fused_e_alone(cand.program) or _vector_around(cand, "E"):
            return []
        twin = search.vectorized(cand)
        return [] if twin is None or not _vector_around(twin, "E") else [twin]

    made = 0
    for _, (twin,) in _drawn_with_twins(search, twin_of_a_scalar_fused_e, draws=400):
        assert fused_e_alone(twin.program)
        loops = twin.program.enclosing("E")
        assert loops[-1].kind == LoopKind.VECTOR and loops[-1].name.startswith("E.j")
        assert loops[-1].extent in space.vector_lanes
        if made < 3:
            _runs_right_on_two_threads(twin, space)
        made += 1
    assert made >= 3


def test_an_epilogue_twin_inlines_the_scale_shift_and_fuses_the_relu_into_the_tile():
    space = build_space(scaled_relu_matmul(8, 16, 8), default_rules())
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=6)
    made = 0
    for _ in range(60):
        cand = search.random_candidate()
        twin = search.epilogue_fused(cand)
        if twin is None:
            continue
        assert space.contains(twin.term, twin.sizes)
        if "D" in {blk.stage for blk in twin.program.blocks()}:
            continue  # D shares a nest with E already: the twin only fuses
        assert twin.term.inlined == ("D",)
        root = next(n for n in twin.program.body if isinstance(n, Loop)
                    and "C.update" in {b.name for b in _blocks_under(n)})
        if "E" in {b.name for b in _blocks_under(root)}:  # fused: after C.k, in C's tile
            made += 1
            if made <= 3:
                _runs_right_on_two_threads(twin, space)
    assert made >= 3
    # No draw of that space inlines D by chance: the twin is how the search gets there.
    assert not any("D" in search.random_candidate().term.inlined for _ in range(60))


@pytest.fixture(scope="module")
def padded_conv():
    """A small convolution that pads its input: `Xpad` selects between X and zero."""
    comp = get_workload("conv2d_nchw").build(1, 4, 6, 6, 8, 3, 3, 1, 1)
    return build_space(naive_program(comp), default_rules())


def _padding_twins(search, draws=80):
    """(candidate, its padding twin) for each draw that has one."""
    for _ in range(draws):
        cand = search.random_candidate()
        twin = search.padding_inlined(cand)
        if twin is not None:
            yield cand, twin


def test_a_padding_twin_reads_the_input_in_the_convolution_with_the_same_sizes(padded_conv):
    search = EvolutionarySearch(padded_conv, FewestScalarIterations(), seed=2)
    comp = padded_conv.naive.computation
    inputs = random_inputs(comp, 0)
    expected = reference(comp, inputs)
    made = 0
    for cand, twin in _padding_twins(search):
        assert padded_conv.contains(twin.term, twin.sizes)
        assert "Xpad" not in cand.term.inlined and "Xpad" in twin.term.inlined
        assert twin.sizes == {k: v for k, v in cand.sizes.items() if k in twin.sizes}
        assert "Xpad" not in {blk.name for blk in twin.program.blocks()}
        assert search.padding_inlined(twin) is None  # nothing left to inline
        if made < 3:
            ok, _, message = compare(compile_program(twin.program).run(inputs), expected,
                                     tolerance(comp))
            assert ok, message
        made += 1
    assert made >= 3
    # The epilogue twin leaves a padding alone: its readers recompute it.
    cand = next(cand for cand, _ in _padding_twins(search))
    epilogue = search.epilogue_fused(cand)
    assert epilogue is None or "Xpad" not in epilogue.term.inlined


class PaddingLast(FewestScalarIterations):
    """Ranks every program that reads the input through a select below every other."""

    name = "test-padding-last"

    def predict(self, programs):
        scores = super().predict(programs)
        inlined = [not any(blk.name == "Xpad" for blk in p.blocks()) for p in programs]
        return scores + np.where(inlined, 1e9, 0.0)


def test_the_search_measures_the_best_programs_padding_twin_whatever_the_model_says(
        padded_conv):
    search = EvolutionarySearch(padded_conv, PaddingLast(), seed=3, population=32,
                                generations=1, max_generations=1)
    best, twin = next(_padding_twins(search))
    batch = search.propose(4, elites=[best])
    assert len(batch) == 4 and batch[0][0].hash == twin.hash
    assert batch[0][1] > 1e9  # predicted the slowest, measured all the same
    assert all("Xpad" not in c.term.inlined for c, _ in batch[1:])  # the model ranks the rest
    # Once per best program: not again while it stays the best, nor when already measured.
    again = search.propose(4, exclude=[c.hash for c, _ in batch], elites=[best])
    assert twin.hash not in {c.hash for c, _ in again}
    fresh = EvolutionarySearch(padded_conv, PaddingLast(), seed=3, population=32,
                               generations=1, max_generations=1)
    measured = fresh.propose(4, exclude=[twin.hash], elites=[best])
    assert twin.hash not in {c.hash for c, _ in measured}


def test_the_search_stops_probing_after_probes_measured_slower_than_their_parents(padded_conv):
    search = EvolutionarySearch(padded_conv, PaddingLast(), seed=4, population=32,
                                generations=1, max_generations=1)
    pairs = list(_padding_twins(search, draws=300))
    bests = list({cand.hash: cand for cand, _ in pairs}.values())[:6]
    assert len(bests) == 6

    def probed(best, top=()):  # a round whose measured top is `best` and `top`
        return [c for c, _ in search.propose(2, elites=[best, *top])
                if "Xpad" in c.term.inlined and "Xpad" not in best.term.inlined]

    first = probed(bests[0])
    assert len(first) == 1 and len(probed(bests[1])) == 1
    # Two rounds on, a probe is judged against its parent: the first in the measured top
    # with its parent out of it paid, so probing goes on.
    assert len(probed(bests[2], top=first)) == 1
    # The second probe and its parent both out of the top: undecided, not a miss.
    assert len(probed(bests[3])) == 1
    assert len(probed(bests[4], top=[bests[2]])) == 1  # the third behind its parent: a miss
    assert len(probed(bests[5], top=[bests[3]])) == 0  # the fourth too: no more probes


def _blocks_under(loop):
    return [n for n, _ in walk_nodes(loop.body) if isinstance(n, Block)]

def _around_the_reduction(prog):
    """The loops around C.update: those outside its innermost serial loop over k, that loop,
    and those inside it."""
    loops = prog.enclosing("C.update")
    at = max(i for i, lp in enumerate(loops)
             if lp.name.startswith("C.k") and lp.kind == LoopKind.SERIAL)
    return loops[:at], loops[at], loops[at + 1:]


def _drawn_with_twins(search, make, draws=300):
    """(candidate, `make`'s twins of it) for each of `draws` random draws that has any twins;
    every twin must be a member of the space."""
    for _ in range(draws):
        cand = search.random_candidate()
        twins = make(cand)
        if twins:
            for twin in twins:
                assert search.space.contains(twin.term, twin.sizes)
            yield cand, twins


def test_a_register_tiled_twin_holds_the_unrolled_loops_inside_the_reduction_loop(space):
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=5)
    made = cut = 0
    for cand, twins in _drawn_with_twins(search, search.register_tiled):
        outside, reduction, _ = _around_the_reduction(cand.program)
        assert outside[-1].kind == LoopKind.UNROLL and reduction.kind == LoopKind.SERIAL
        for twin in twins:
            _, raised, inside = _around_the_reduction(twin.program)
            assert raised.kind == LoopKind.SERIAL
            assert outside[-1].name in {lp.name for lp in inside}
            if made < 3:
                _runs_right_on_two_threads(twin, space)
        assert twins[0].sizes == cand.sizes  # the first keeps the sizes, the others cut the tile
        moved = []  # the unrolled loops the reduction loop came out of (not its own pieces)
        for lp in reversed(outside):
            if lp.kind != LoopKind.UNROLL:
                break
            if not lp.name.startswith("C.k"):
                moved.append(lp)
        longest = max(moved, key=lambda lp: lp.extent)
        for twin in twins[1:]:
            cut += 1
            extents = {lp.name: lp.extent for lp in _around_the_reduction(twin.program)[2]}
            assert extents[longest.name] < longest.extent
        made += 1
    assert made >= 3 and cut >= 1


def test_a_reshaped_twin_trades_a_loop_of_the_tile_for_one_around_the_reduction(space):
    # A tile of one row by many vectors loads a vector per FMA: the twin takes a short loop
    # from around the reduction loop into the tile, unrolled, and may give one unrolled loop
    # of another group back, serial or unrolled, where the reduction loop was.
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=6)
    made = traded = 0
    for cand, twins in _drawn_with_twins(search, search.reshaped):
        outside, reduction, inside = _around_the_reduction(cand.program)
        before = {lp.name for lp in inside}
        for twin in twins:
            assert twin.sizes == cand.sizes
            _, _, tile = _around_the_reduction(twin.program)
            taken_in = [lp for lp in tile if lp.name not in before]
            given_back = before - {lp.name for lp in tile}
            assert len(taken_in) == 1 and taken_in[0].kind == LoopKind.UNROLL
            assert taken_in[0].name in {lp.name for lp in outside}
            vector_axes = {lp.name.rsplit(".", 1)[0] for lp in tile if lp.kind == LoopKind.VECTOR}
            assert taken_in[0].name.rsplit(".", 1)[0] not in vector_axes
            assert len(given_back) <= 1
            traded += len(given_back)
            if made < 3:
                _runs_right_on_two_threads(twin, space)
            made += 1
    assert made >= 3 and traded >= 1


def test_a_packed_twin_packs_the_tile_columns_operand_in_panels_of_their_width(space):
    # B[k, j] under a tile of vector columns: the twin reads B_packed[j // w, k, j % w], w the
    # columns the loops inside the reduction loop cover, every other size kept, and runs right.
    search = EvolutionarySearch(space, FewestScalarIterations(), seed=7)
    made = 0
    for cand, twins in _drawn_with_twins(search, search.packed, draws=400):
        for twin in twins:
            (added,) = set(twin.term.packs) - set(cand.term.packs)
            assert added.buffer == "B" and added.dim == 1
            assert {k: v for k, v in twin.sizes.items() if k != ("pack:B", "")} == cand.sizes
            loops = twin.program.enclosing("C.update")
            inner = max(i for i, lp in enumerate(loops) if lp.name.startswith("C.k"))
            columns = math.prod(lp.extent for lp in loops[inner + 1:]
                                if lp.name.startswith("C.j"))
            assert twin.program.buffer("B_packed").shape[-1] == columns
            if made < 3:
                _runs_right_on_two_threads(twin, space)
            made += 1
    assert made >= 3


class _Drawn:
    def __init__(self, sketch):
        self.sketch = sketch


def test_each_sketchs_best_stay_among_the_survivors():
    # Ten of sketch "a" rank first; the best of "b" and "c" still make a cut of eight (up to
    # half of it goes to each sketch's best two, the rest to the best overall).
    ranked = [(_Drawn("a"), float(t)) for t in range(10)] + \
        [(_Drawn(s), 10.0 + t) for t in range(3) for s in "bc"]
    kept = _with_every_sketch(ranked, 8)
    assert [c.sketch for c, _ in kept] == ["a"] * 6 + ["b", "c"]
    assert [t for _, t in kept] == sorted(t for _, t in kept)  # still in rank order
    assert _with_every_sketch(ranked[:5], 6) == ranked[:5]


def test_a_sketch_is_its_local_tiles_packs_and_vectorized_reduction_axes(space):
    s = Schedule(space.naive)
    s.split("C.j", [2, 16])
    s.reorder("C.i", "C.j.0", "C.k", "C.j.1")
    s.vectorize("C.j.1")
    s.pack("C.update", "B", 1, 16)
    s.split("C.init.j", [2, 16])
    s.vectorize("C.init.j.1")  # not a reduction's: no part of the sketch
    cand = Candidate(None, {}, s.program, {}, {}, space.naive)
    assert cand.sketch == (("B_packed",), ("C.j",))


class UpdateScalarIterations(FewestScalarIterations):
    """FewestScalarIterations of the reduction's blocks only: programs that differ only in how
    they zero the output tie, as they do on a real model."""

    name = "test-update-scalar-iterations"

    def counts(self, blk):
        return not isinstance(blk.value, Const)


def test_a_kernel_is_the_program_less_its_fills_of_a_constant(space):
    def program(init_order, k_split):
        s = Schedule(space.naive)
        s.split("C.init.j", [2, 16])
        s.reorder(*init_order)
        s.vectorize("C.init.j.1")
        s.split("C.k", k_split)
        return Candidate(None, {}, s.program, {}, {}, space.naive)

    a = program(("C.init.i", "C.init.j.0", "C.init.j.1"), [2, 4])
    b = program(("C.init.j.0", "C.init.i", "C.init.j.1"), [2, 4])
    c = program(("C.init.i", "C.init.j.0", "C.init.j.1"), [4, 2])
    assert a.hash != b.hash and a.kernel == b.kernel
    assert a.kernel != c.kernel


def test_a_kernels_twins_wait_until_every_other_kernel_is_proposed(space):
    class Twin:
        def __init__(self, kernel):
            self.kernel = kernel

    search = EvolutionarySearch(space, UpdateScalarIterations(), seed=0)
    ranked = [(Twin(k), float(t)) for t, k in enumerate("aaabac")]
    fresh, twins = search._twins_apart(ranked)
    assert [c.kernel for c, _ in fresh] == ["a", "a", "b", "c"]
    assert [t for _, t in twins] == [2.0, 4.0]  # the third and fourth "a", in rank order
    search._proposed.update(["a", "b"])  # an earlier round proposed one of each
    fresh, twins = search._twins_apart(ranked)
    assert [t for _, t in fresh] == [0.0, 3.0, 5.0]


def test_a_run_measures_other_kernels_before_a_third_twin(space):
    # With seed 0 the top of the third round holds a third program of one kernel, whose
    # twins differ only in the nest that zeroes C.
    search = EvolutionarySearch(space, UpdateScalarIterations(), seed=0, population=48,
                                generations=2, random_fraction=0)
    proposed = []
    for _ in range(3):
        proposed += search.propose(6, exclude={c.hash for c, _ in proposed})
    kernels = Counter(c.kernel for c, _ in proposed)
    assert len(proposed) == 18
    assert max(kernels.values()) <= TWINS_MEASURED
