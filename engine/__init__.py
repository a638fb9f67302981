"""Continuous batching: requests, sequences, the scheduler and the step loop."""
from engine.config import EngineConfig
from engine.engine import Engine
from engine.handle import RequestHandle
from engine.inbox import QueueFullError
from engine.policy import FifoPolicy, SchedulingPolicy, TwoTierPolicy
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
from engine.stats import EngineStats, TierStats
from sampling.params import InvalidParameterError, SamplingParams

__all__ = [
    "Engine", "EngineConfig", "EngineStats", "QueueFullError", "RequestHandle", "EngineClosedError",
    "FinishReason", "GenerationResult", "Priority", "PromptTooLongError", "Request", "RequestError",
    "RequestMetrics", "InvalidParameterError", "SamplingParams", "SchedulingPolicy", "FifoPolicy", "TwoTierPolicy",
    "TierStats",
]
