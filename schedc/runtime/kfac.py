"""schedc.runtime.kfac: the import path the docs give; the module is schedc.runtime.model.kfac."""
from __future__ import annotations

from .model.kfac import (
    CURVATURE, DAMPING, EMA, KFAC_TASKS, Kfac, LAYERS, Pieces, StageFactors, attach, curvature_a, curvature_b,
    damped_inverse, factor_sizes, inversion, layer_input, pieces_of, precondition, precondition_cut,
    precondition_layer, weight_grad, whole_rows)

__all__ = ["CURVATURE", "DAMPING", "EMA", "KFAC_TASKS", "Kfac", "LAYERS", "Pieces", "StageFactors", "attach",
           "curvature_a", "curvature_b", "damped_inverse", "factor_sizes", "inversion", "layer_input",
           "pieces_of", "precondition", "precondition_cut", "precondition_layer", "weight_grad",
           "whole_rows"]
