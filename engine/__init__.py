"""Continuous batching: requests, sequences, the scheduler and the step loop."""
from engine.config import EngineConfig
from engine.engine import Engine
from engine.handle import RequestHandle
from engine.policy import FifoPolicy, SchedulingPolicy, TwoTierPolicy
from engine.request import FinishReason, GenerationResult, Priority, Request, RequestMetrics
from engine.stats import EngineStats, TierStats
from engine.errors import REFUSALS, EngineClosedError, PromptTooLongError, QueueFullError
from sampling.errors import InvalidParameterError, RequestError
from sampling.params import SamplingParams

__all__ = [
    "Engine", "EngineConfig", "EngineStats", "QueueFullError", "RequestHandle", "EngineClosedError",
    "FinishReason", "GenerationResult", "Priority", "PromptTooLongError", "Request", "RequestError",
    "RequestMetrics", "InvalidParameterError", "SamplingParams", "SchedulingPolicy", "FifoPolicy", "TwoTierPolicy",
    "TierStats", "REFUSALS",
]
