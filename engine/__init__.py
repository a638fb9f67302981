"""Continuous batching: requests, sequences, the scheduler and the step loop."""
from engine.config import EngineConfig
from engine.engine import Engine
from engine.handle import RequestHandle
from engine.policy import FifoPolicy, SchedulingPolicy, TwoTierPolicy
from engine.request import FinishReason, GenerationResult, Priority, Request, RequestMetrics
from engine.stats import EngineStats, TierStats
from sampling.errors import (
    REFUSALS,
    EngineClosedError,
    InvalidParameterError,
    PromptTooLongError,
    QueueFullError,
    RequestError,
)
from sampling.params import SamplingParams

__all__ = [
    "Engine", "EngineConfig", "EngineStats", "QueueFullError", "RequestHandle", "EngineClosedError",
    "FinishReason", "GenerationResult", "Priority", "PromptTooLongError", "Request", "RequestError",
    "RequestMetrics", "InvalidParameterError", "SamplingParams", "SchedulingPolicy", "FifoPolicy", "TwoTierPolicy",
    "TierStats", "REFUSALS",
]
