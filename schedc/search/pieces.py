"""What tune's walk (schedc/search/searcher.py) asks of a candidate's layout before any order: its
setting, its schedule's shape, its stage costs, message times, the bytes its stages hold, and its lower
bound (schedc/search/bounds.py), each cached under what it reads. The bound of every candidate of the
space is asked for (38,460 of them for GPT-3 on 1,024 GPUs), so a key leaves out what a value does not
depend on, and a value that varies with m alone is kept in parts that do not:

    held bytes        per placement and t (and d when sharded): not b, m or recomputation (held_bytes)
    tail bound        per placement and (t, d): step_tails reads neither b nor recomputation
    makespan bound    per pipeline's placement and cost vector, the terms of bounds.pipeline_terms; the
                      microbatches multiply one of them per candidate (bounds.combine_terms)

The values are those of the uncached functions, bit for bit (tests/test_tune.py holds them to the plain
forms over a grid of candidates), so pruning by them keeps tune exact as the bounds themselves do.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .bounds import Shape, combine_terms, lane_bound, pipeline_terms, state_bound, tail_bound
from ..costmodel import Setting, costs_problem, held_bytes, link_times, message_times, stage_costs
from ..costmodel.sharding import Sharded, sharded_collectives
from ..costmodel.specs import check_switches, load_cluster, load_cluster_model
from ..diagnostics import SchedError
from ..layout import SPLIT_NAMES, SplitError
from ..text import GIB
from .results import Refusal
from .space import MOE_ONLY, Candidate, Request, library_entries, sharding_choices


class Pieces:
    """A request's model, cluster and schedules, and the caches of its candidates' pieces."""

    def __init__(self, request: Request):
        self.request = request
        self.cluster = load_cluster(request.cluster)
        self.model = load_cluster_model(request.model, self.cluster, request.seq)
        check_switches(request.layout, self.cluster)  # the request's switches are every candidate's
        self.limit = request.memory_limit if request.memory_limit is not None else self.cluster.memory_bytes
        self.entries = {e.name: e for e in library_entries(request.schedules)}
        if not request.schedules and not self.model.moe:  # Megatron-Core runs it only with experts
            self.entries.pop(MOE_ONLY, None)
        self.shardings = sharding_choices(self.model, request)  # refuses a fixed --cp or --zero the model refuses
        if request.layout.post_validation:  # two steps back to back: simulate's, every candidate compiled whole
            self.entries = {name: replace(e, plain=True) for name, e in self.entries.items()}
        self.settings: dict[tuple, Setting] = {}
        self.shapes: dict[tuple, Shape | Refusal] = {}
        self.costs: dict[tuple, Any] = {}
        self.states: dict[tuple, Any] = {}
        self.links: dict[tuple, Any] = {}
        self.terms: dict[tuple, tuple] = {}

    def setting(self, c: Candidate) -> Setting:
        """The candidate's model, cluster and layout (frozen: one per (t, d, b, recompute))."""
        key = (c.t, c.d, c.b, c.recompute, c.cp, c.zero, c.ep)
        if key not in self.settings:
            r = self.request
            self.settings[key] = Setting(self.model, self.cluster, replace(
                r.layout, tp=c.t, dp=c.d, microbatch_size=c.b, global_batch=r.global_batch, recompute=c.recompute,
                cp=c.cp, zero=c.zero, distributed_optimizer=False,  # zero 1 is the distributed optimizer (Layout)
                ep=c.ep))
        return self.settings[key]

    def shape(self, c: Candidate) -> Shape | Refusal:
        """The candidate's pipelines, or why the schedule refuses its params or the layers do not fit
        (asked first, of the stage count alone: outside the space whatever the schedule would say)."""
        key = c.structure_key()
        if key not in self.shapes:
            from ..frontend.elaborate import shape_of, stage_count
            entry = self.entries[c.schedule]
            outside = self._layers(stage_count(entry.decl, entry.source, c.params()))
            if outside is not None:
                self.shapes[key] = outside
                return outside
            try:
                _, devices, pipelines = shape_of(entry.decl, entry.source, c.params())
            except SchedError as exc:
                self.shapes[key] = Refusal(exc.diagnostics[0].message)
            else:
                self.shapes[key] = self._layers(pipelines[0].stages) or Shape(devices, pipelines)
        return self.shapes[key]

    def _layers(self, stages: int | None) -> Refusal | None:
        """The refusal of stages the layer split does not fit (outside the space, whatever the schedule's
        requires say): with the request's split (schedc.layout.split_layers) where it gives one, else
        stages that do not divide the model's layers; or None."""
        layout = self.request.layout
        if stages and any(getattr(layout, name) for name in SPLIT_NAMES):
            try:
                layout.layer_split(self.model.layers, stages)
            except SplitError as exc:
                return Refusal(str(exc), layers=True)
        elif stages and self.model.layers % stages:
            return Refusal(f"{stages} stages do not divide the {self.model.layers} layers", layers=True)
        return None

    def stage_costs(self, st: Setting, c: Candidate, shape: Shape):
        """F, B, I, W per stage; with blocking sends they hold the message time of the first pipeline's
        placement (as driver.cluster.compile_for gives them), which depends on d through the ranks' nodes."""
        return self._costs(st, c, shape)[0]

    def cost_table(self, st: Setting, c: Candidate, shape: Shape) -> tuple[dict[str, tuple[float, ...]], str | None]:
        """The stage costs' table (StageCosts.costs()) and why it cannot be a schedule's costs
        (costs_problem, as simulate --cluster refuses a 1e-320 GB/s HBM), or None; cached with them."""
        return self._costs(st, c, shape)[1:]

    def _cost_key(self, c: Candidate, shape: Shape) -> tuple:
        key = (c.t, c.b, c.recompute, shape.stages, c.cp, c.zero, c.ep)
        return key + (c.d, shape.pipelines[0].placement) if self.request.layout.blocking_p2p else key

    def _costs(self, st: Setting, c: Candidate, shape: Shape) -> tuple:
        key = self._cost_key(c, shape)
        if key not in self.costs:
            blocking = self.request.layout.blocking_p2p
            times = self.message_times(st, c, shape.devices) if blocking else None
            costs = stage_costs(st, shape.stages, shape.pipelines[0].placement, times)
            table = costs.costs()
            self.costs[key] = (costs, table, costs_problem(table, st))
        return self.costs[key]

    def held(self, st: Setting, c: Candidate, shape: Shape) -> tuple:
        """held_bytes, cached per placement and t (and d with the distributed optimizer): what it reads."""
        key = ("held", tuple(p.placement for p in shape.pipelines), shape.devices, c.t, c.cp, c.zero, c.ep) + \
            ((c.d,) if c.zero else ())
        if key not in self.states:
            self.states[key] = held_bytes(st.model, st.layout, shape)
        return self.states[key]

    def state_bound(self, st: Setting, c: Candidate, shape: Shape) -> tuple[float, int]:
        """state_bound, cached per placement and (t, b, recompute): it depends on neither d nor m, but
        for d with the distributed optimizer (the shards)."""
        key = (tuple(p.placement for p in shape.pipelines), shape.devices, c.t, c.b, c.recompute, c.cp, c.zero,
               c.ep) + ((c.d,) if c.zero else ())
        if key not in self.states:
            self.states[key] = state_bound(st, shape, self.held(st, c, shape))
        return self.states[key]

    def tail_bound(self, st: Setting, c: Candidate, shape: Shape) -> float:
        """tail_bound, cached per placement and (t, d): it depends on neither the order nor m, and
        step_tails reads neither b nor recomputation."""
        key = ("tail", tuple(p.placement for p in shape.pipelines), shape.devices, c.t, c.d, c.cp, c.zero, c.ep)
        if key not in self.states:
            self.states[key] = tail_bound(st, shape)
        return self.states[key]

    def message_times(self, st: Setting, c: Candidate, devices: int):
        key = ("messages", c.t, c.d, c.b, devices, c.cp, c.ep)
        if key not in self.links:
            self.links[key] = message_times(st, devices)
        return self.links[key]

    def link_times(self, st: Setting, c: Candidate, devices: int):
        key = (c.t, c.d, c.b, devices, c.cp, c.ep)
        if key not in self.links:
            self.links[key] = link_times(st, devices)
        return self.links[key]

    def bound(self, c: Candidate) -> float | Refusal:
        """A lower bound of the candidate's iteration time (0 where none is taken: a schedule compiled
        whole, a mixed backward, --exhaustive), or why it is refused before any simulation (its
        schedule's or the layers', or its weights and optimizer state alone over the limit)."""
        shape = self.shape(c)
        if isinstance(shape, Refusal):
            return shape
        st = self.setting(c)
        state, device = self.state_bound(st, c, shape)
        if state > self.limit:
            return self.over(state, device, " (weights, gradients, optimizer state and working memory alone)",
                             bound=True)
        entry = self.entries[c.schedule]
        table, problem = self.cost_table(st, c, shape)
        if problem is not None:
            return Refusal(problem)
        if entry.plain or self.request.exhaustive:
            return 0.0
        busy = self.makespan_bound(st, c, shape)
        if c.zero >= 2:  # the step ends no sooner than the busiest communication lane
            busy = max(busy, self.lane_bound(st, c, shape))
        return busy + self.tail_bound(st, c, shape)

    def compiled_whole(self, c: Candidate) -> bool:
        """Whether the candidate is compiled whole (driver.cluster.compile_for) rather than through the
        cached order: its schedule's order needs it, or --exhaustive's ZeRO 2/3 (the reference the walk's
        cached order, timed with the same lanes, is held to)."""
        return self.entries[c.schedule].plain or (c.zero >= 2 and self.request.exhaustive)

    def sharded(self, st: Setting, c: Candidate, shape) -> Sharded | None:
        """sharding.sharded_collectives (what ZeRO 2/3 puts on each device's lane), cached per placement
        and what the collectives' times read (t, d, cp, the level; not b, m or recomputation)."""
        key = ("sharded", tuple(p.placement for p in shape.pipelines), shape.devices, c.t, c.d, c.cp, c.zero, c.ep)
        if key not in self.states:
            self.states[key] = sharded_collectives(st, shape)
        return self.states[key]

    def lane_bound(self, st: Setting, c: Candidate, shape: Shape) -> float:
        """bounds.lane_bound, cached per placement and what the collectives' times read (t, d, cp, the
        level and the microbatches; not b or recomputation)."""
        key = ("lane", tuple(p.placement for p in shape.pipelines), tuple(len(p.microbatches) for p in shape.pipelines),
               shape.devices, c.t, c.d, c.cp, c.zero, c.ep)
        if key not in self.states:
            self.states[key] = lane_bound(self.sharded(st, c, shape), shape)
        return self.states[key]

    def makespan_bound(self, st: Setting, c: Candidate, shape: Shape) -> float:
        """bounds.makespan_bound from each pipeline's terms, cached per placement, cost vector and links
        (shared by the schedules of one placement and by every m)."""
        entry = self.entries[c.schedule]
        table, _ = self.cost_table(st, c, shape)
        links = self.link_times(st, c, shape.devices)
        costs, linked = self._cost_key(c, shape), (c.t, c.d, c.b, shape.devices, c.cp, c.ep)
        terms = []
        for pipe in shape.pipelines:
            key = (pipe.placement, entry.split, entry.mixed, entry.pairs, costs, linked)
            if key not in self.terms:
                self.terms[key] = pipeline_terms(pipe.placement, table, links, entry.split, entry.mixed,
                                                 entry.pairs)
            terms.append(self.terms[key])
        return combine_terms(shape, terms)

    def over(self, nbytes: float, device: int, what: str = "", bound: bool = False) -> Refusal:
        return Refusal(f"does not fit: {nbytes / GIB:.4g} GiB > {self.limit / GIB:.4g} GiB at device {device}{what}",
                       nbytes, bound=bound)
