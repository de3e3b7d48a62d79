"""MixLLM global precision search (Sec. 3.2): Eq. 4 salience per output channel, Algorithm 1 allocation to a
target average bit-width, and the plan file that records the result."""

from quantkit.search.allocate import BitBudget, allocate, assign_ranked, average_bits
from quantkit.search.plan import LayerPlan, Plan, build_plan
from quantkit.search.plan_check import load_plan
from quantkit.search.run import SearchOptions, search
from quantkit.search.salience import SalienceResult, compute_salience
from quantkit.search.strategies import STRATEGIES, magnitude_scores, random_scores

__all__ = ["STRATEGIES", "BitBudget", "LayerPlan", "Plan", "SalienceResult", "SearchOptions", "allocate",
           "assign_ranked", "average_bits", "build_plan", "compute_salience", "load_plan", "magnitude_scores",
           "random_scores", "search"]
