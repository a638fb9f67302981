"""Continuous batching: requests, sequences, the scheduler and the step loop."""
from engine.config import EngineConfig
from engine.engine import Engine, EngineStats, QueueFullError, TierStats
from engine.handle import RequestHandle
from engine.priority import PriorityPolicy
from engine.request import (
    EngineClosedError,
    FinishReason,
    GenerationResult,
    Priority,
    PromptTooLongError,
    Request,
    RequestError,
    RequestMetrics,
)
from sampling.params import InvalidParameterError, SamplingParams

__all__ = [
    "Engine", "EngineConfig", "EngineStats", "QueueFullError", "RequestHandle", "EngineClosedError",
    "FinishReason", "GenerationResult", "Priority", "PromptTooLongError", "Request", "RequestError",
    "RequestMetrics", "InvalidParameterError", "SamplingParams", "PriorityPolicy", "TierStats",
]
