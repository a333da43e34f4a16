"""eqsched.extract: choosing programs from the saturated e-graph (installed from extract/).

    from eqsched.extract import get_cost_model, EvolutionarySearch
    search = EvolutionarySearch(space, get_cost_model("analytic"), seed=0)
    batch = search.propose(8)                      # [(Candidate, predicted seconds), ...]

- `cost`: the CostModel interface (one method, `predict`; learners also `update`), the registry
  (`get_cost_model(name or object)`), a random baseline, rank correlations.
- `analytic`: a cycle model of one core (ports, FMA latency, register tiles, cache reuse) whose
  hardware numbers come from the target's calibrated `eqsched.machine_model.MachineModel`.
- `features` + `learned`: program features and LightGBM ranking trees on them, trained on this
  machine's stored measurements and the run's (the analytic prior until they rank better).
- `search`: an evolutionary search over a walk's choices of e-nodes and tile sizes.
- `baseline`: egglog's own extractor (smallest term), the yardstick for the search.
A new cost model is one file: subclass `CostModel`, decorate it with `@register`.

See docs/ARCHITECTURE.md §8 Cost models.
"""

from eqsched.backend import Target
from eqsched.machine_model import machine_model

from . import learned  # noqa: F401  (importing a model's module registers it)
from .analytic import AnalyticModel
from .cost import COST_MODELS, CostModel, CostModelError, get_cost_model, register
from .search import Candidate, EvolutionarySearch


def cost_model_for(spec: str | CostModel, threads: int,
                   target: Target | None = None) -> CostModel:
    """A model by name or object; the built-in models predict for the measured thread count on
    `target` (default: the host), from its calibrated machine model."""
    if spec == "analytic":
        return AnalyticModel(machine_model(target), threads=threads)
    if spec == "learned":
        return get_cost_model("learned", prior=AnalyticModel(machine_model(target),
                                                             threads=threads))
    return get_cost_model(spec)


__all__ = ["COST_MODELS", "Candidate", "CostModel", "CostModelError", "EvolutionarySearch",
           "cost_model_for", "get_cost_model", "register"]
