"""Every number that shapes scheduling and is not a user's setting, with why it has its value.

Settings a user may change live in EngineConfig (engine/config.py, docs/configuration.md);
these are the engine's internal constants. Each says in one line why it has its value and
where that was measured (a stored run under bench/results/, a docs section, a commit), or says
"judgement" where it was chosen, not measured: those are the first to question.
"""
from __future__ import annotations

# ---- the per-token latency target (engine/policy.py, docs/scheduling.md) ------------------------
# How much longer an interactive token's interval runs than the step-cost model predicts (the
# loop around the decode, noise), tracked at its 95th percentile: an interval over the estimate
# raises it by UP, one under lowers it by DOWN, which balance where one interval in twenty is over.
# Start: judgement (70e6efb); the engine learns 1.00-1.52, median 1.21, over 44 floods in 16 runs
# (e.g. bench/results/20261127T085514Z-mixed-priority).
CALIBRATION_START = 1.25
CALIBRATION_RANGE = (0.5, 4.0)  # judgement: no run of misses drives the plan to no rows or to any number
# Judgement (70e6efb): fast enough to follow a slower minute within a few tokens; inter-token p95
# 124-148 ms against the 150 ms target (bench/results/20261127T013157Z-mixed-priority).
CALIBRATION_UP = 0.05
CALIBRATION_DOWN = CALIBRATION_UP * 0.05 / 0.95

# ---- deep batch prompts (engine/policy.py) -----------------------------------------------------
# Past this many cells a prompt chunk's attention makes long graph nodes, and an abort lands only
# between nodes: chunks of DEEP_PROMPT_CHUNK halve that wait (p90 38-61 ms against 69-123 at 20k
# cells) at no prefill cost past 10k cells; 64, 96 and 192 did worse (8dcf099, docs/scheduling.md,
# bench/results/20261127T072550Z-long-prompt).
DEEP_PROMPT_FROM = 8192
DEEP_PROMPT_CHUNK = 128

# ---- the interrupt window (engine/interrupt_window.py) -----------------------------------------
# A step of prompt chunks alone ends in one output row, not an unabortable projection, so an
# arrival may abort it until this fraction of a typical one (5ae9be1: chats during a long
# prefill from up to 3.40x idle TTFT to a median 1.37-1.43x, bench/results/20261127T020505Z-long-prompt).
PROMPT_ONLY_INTERRUPT_FRACTION = 0.9
# Weight of the newest step in the moving average of a typical step: judgement (b3d95f5), follows
# a change within about five steps without letting one odd step move the window.
TYPICAL_STEP_NEWEST_WEIGHT = 0.2

# ---- fair share within a tier (engine/fair_share.py) ------------------------------------------
# Weight of a finished request's generated tokens in its tenant's moving average, the output an
# admission is charged for in advance: judgement, follows a change in a tenant's answers within
# about ten requests.
TYPICAL_OUTPUT_WEIGHT = 0.1

# ---- the first-token lane (engine/first_token_lane.py) -----------------------------------------
# A second lane thread contends with the engine's for the same cores; on one thread a 32-token
# prompt takes 65 ms against 36 on two (66a3cd9, docs/scheduling.md, "The first-token lane";
# bench/results/20261127T042334Z-mixed-priority).
LANE_THREADS = 1
LANE_HOLD_MAX_S = 0.3  # judgement: a short prompt's first token on one thread takes 25-220 ms
LANE_MIN_CELLS = 256  # llama.cpp pads a context to a multiple of 256 cells anyway

# ---- the engine loop (engine/loop.py) ----------------------------------------------------------
IDLE_WAIT_S = 0.05  # judgement: only deadlines need the poll; every arrival wakes the thread at once
# Judgement: a cancellation is answered within one step, so the drain's wait for the cancelled
# ends long before this unless the engine thread is stuck.
CANCELS_ANSWERED_BACKSTOP_S = 30.0

# ---- the thread governor (engine/thread_governor.py, docs/threads.md) --------------------------
# Step costs kept per thread count and shape: their median shrugs off one odd step, which moved
# a moving average into 2 spurious switches (9efcd55, bench/results/20261124T231556Z-shared-cpu).
GOVERNOR_RECENT = 3
# Judgement (cd248dd): a probe must be this much cheaper to switch, so noise does not flip-flop
# it; no switch in quiet runs (bench/results/20261124T234830Z-shared-cpu).
GOVERNOR_SWITCH_MARGIN = 1.15
GOVERNOR_STALL = 2.0  # judgement (9efcd55): a step this many times its shape's median counts as stalled
GOVERNOR_STALLS_BEFORE_PROBE = 2  # judgement (9efcd55): one stall is a hiccup, two in a row a moved median
# A step this many times its expected cost is cut short and the others probed at once: above an
# ordinary hiccup (3x), below a neighbour taking a core (5-20x) (d8ab4eb, docs/benchmark-history.md,
# bench/results/20261124T234830Z-shared-cpu).
GOVERNOR_SEVERE_STALL = 4.0
GOVERNOR_FIRST_PROBE_S = 2.0  # judgement (cd248dd): the first probe, and the next ones while they agree
GOVERNOR_MAX_PROBE_S = 30.0  # judgement (cd248dd): the longest gap while the most threads keep winning
# Below the most threads, probes back off only to this: a losing probe with more threads is cut
# short, while missing a neighbour's departure costs half the speed (6b28036: 0.81 of fixed
# threads at 30 s, bench/results/20261125T004801Z-shared-cpu; 0.99 at 8 s, bench/results/20261125T011125Z-shared-cpu).
GOVERNOR_MAX_PROBE_UP_S = 8.0
# Routine probes skip prompt steps expected to take longer than this: a one-thread probe of a
# deep chunk ran 2 s and held up a chat (62c3477: worst chat 6.63x idle, bench/results/20261127T014232Z-long-prompt,
# to 2.68x, bench/results/20261127T020505Z-long-prompt). With nothing but long prompt steps, a
# count is still probed once it has gone GOVERNOR_LONG_STEPS_PROBE_S unprobed (judgement).
GOVERNOR_QUICK_STEP_S = 0.25
GOVERNOR_LONG_STEPS_PROBE_S = 60.0
GOVERNOR_WATCHDOG_IDLE_S = 30.0  # judgement: a stopped engine leaves no watchdog thread behind

# ---- the step-cost model (engine/step_cost.py); all judgement (b4fa271, 9303920) -----------------
STEP_COST_WINDOW = 128  # steps remembered: enough shapes for a stable fit, recent enough to follow the machine
STEP_COST_DECAY = 0.97  # weight of a step one step older: half after 23 steps
# Fixed cost about one row's, a row's cost split evenly token / output; no jump for a second
# output row until steps with one and with several were seen (a draft at one stream shows it).
STEP_COST_PRIOR_SHAPE = (1.0, 0.5, 0.5, 0.0)
STEP_COST_PRIOR_PULL = 0.01  # ridge strength, relative to the data's own curvature: gone once shapes vary
STEP_COST_MIN_STEPS = 8  # steps at one thread count before they are fitted alone (probes beside a neighbour run slow)
STEP_COST_REFIT_STEPS = 8  # steps between refits while the fit predicts well: 8 of a 23-step half-life
STEP_COST_REFIT_MISS = 0.25  # a step this far off its prediction (a share of its time) refits at once

# ---- prompt logprobs (engine/prompt_scores.py) -------------------------------------------------
SCORED_ROWS_AT_ONCE = 16  # judgement: float64 copies of this many vocabulary-wide rows at a time (34 MB at 262k)
# llama.cpp keeps its output buffer as large as the most output rows a step ever had, a
# vocabulary-wide float32 row each: a scored prompt's rows per step keep it within this
# (64 rows at Gemma 3's 262,144-token vocabulary; a whole 256-token chunk would keep 268 MB;
# a6a007d, docs/evaluation.md).
SCORED_OUTPUT_BYTES = 64 * 262_144 * 4

# ---- idle cached prefixes (engine/prefix_reuse.py, docs/kv-cache.md) ---------------------------
# Prefilling one prompt token costs about what this many idle cached cells add to one prompt row,
# on Gemma 3 270M: with flash attention the kernel skips their tiles after reading the mask (27k
# and 41k in e6ff379, 28.3k in bench/results/20261127T142136Z-idle-cells); without it they are
# attended over like any cell (6.1k in the same run). The defaults of `idle_cells_per_prompt_token`;
# `cobatch bench idle-cells` measures them for another model.
IDLE_CELLS_PER_PROMPT_TOKEN_FLASH = 30_000
IDLE_CELLS_PER_PROMPT_TOKEN_NO_FLASH = 6_000
# Judgement (e6ff379): recent prompts count most, the counts halve every this many prompt tokens,
# short enough that a second distinct long prompt in a row drops the idle cells
# (bench/results/20261126T231700Z-long-prompt).
REUSE_HALF_LIFE_TOKENS = 8_192
# Judgement (dc319f5, e6ff379): before anything is measured, half of the prompt tokens are assumed
# to come from the cache, worth a short history: a new server's first miss does not throw the
# first conversation away, and a second one in a row (a stream of distinct documents) does.
REUSE_PRIOR_SHARE, REUSE_PRIOR_TOKENS = 0.5, 1_024

# ---- speculative decoding (engine/drafts.py, engine/speculation.py) ----------------------------
# Prompt lookup matches the sequence's last 4, 3 or 2 tokens (the longest found wins): single
# tokens recur too often to predict what follows (judgement, after prompt-lookup decoding's n <= 3).
DRAFT_NGRAM_MIN, DRAFT_NGRAM_MAX = 2, 4
# Of each n-gram, the latest occurrences kept; the one whose match runs back furthest is copied
# (random sentences over a small vocabulary repeat 4-grams; judgement).
DRAFT_OCCURRENCES = 8
# Other requests' outputs need a longer match before their continuation is trusted (judgement).
RECENT_OUTPUTS_NGRAM_MIN = 3
RECENT_OUTPUT_NGRAMS = 65_536  # n-grams kept of recent outputs, all scopes together: about 20 MB
# Prompt words (engine/prompt_words.py): the word being written is looked for in the output's last
# 8 tokens, and at most 48 bytes of its rest are drafted (a value is a few words; judgement).
PROMPT_WORDS_WINDOW, PROMPT_WORDS_MAX_REST = 8, 48
# A draft's match is measured up to this many tokens: past it a copied passage is as sure as it
# gets (llama-server's ngram-mod matches 24, its ngram-simple 12; judgement).
DRAFT_MATCH_CAP = 32
# Acceptance is learned per source and per bucket of match length (these are the buckets' lower
# bounds): copied passages are kept in runs that end where the copy ends, so one rate for all
# drafts either stops drafting at the first miss or drafts chance matches (judgement).
MATCH_BUCKETS = (0, 2, 3, 4, 6, 8, 12, 16, 24, 32)
# A bucket's rate before any of its drafts was checked, by bucket: presumed good, so that it is
# tried, and better the longer the match (judgement).
ACCEPTANCE_PRIORS = (0.8, 0.8, 0.8, 0.8, 0.8, 0.9, 0.9, 0.95, 0.95, 0.95)
ACCEPTANCE_WEIGHT = 0.1  # weight of each drafted token's outcome in its bucket's moving average (judgement)
# Each sequence's drafts are cut at its own cap: doubled when a draft is kept whole, halved (to
# no less than the minimum) when one misses. A long match can still end where the copy ends (a
# code block closed, then other text): the cap bounds what such confident misses waste, where
# one table of rates for all sequences cannot (after the heuristic schedule of Hugging Face's
# assisted generation). Caps run 3, 7, 15, 31 so that a draft at its cap and its sampling row
# make a multiple of four output rows: llama.cpp's kernels for repacked weights (on CPUs without
# AMX) project four rows at a time and each row left over alone, reading the whole projection
# again. At one stream on an AMD EPYC, 8 output rows took 46.0 ms (as long as 5), 16 took 73.7
# against 17 rows' 90.7, and 32 took 131.5 against 33 rows' 148.1 (a plain step 12.6 ms,
# bench/results/20261201T003851Z-draft-price); elsewhere a row fewer costs a draft little.
# Start and minimum otherwise judgement.
DRAFT_CAP_START, DRAFT_CAP_MIN = 7, 3
# The same kernels make a step's output rows cost by the block of four, whatever the streams: at
# 16 streams on the AMD EPYC, 1 draft row added 18.8 ms to an 85.4 ms step and 4 rows 16.8 ms
# (3 rows 29.2, 5 rows 34.3, 8 rows 34.4). So the draft rows granted bring a step's output rows to
# a multiple of four where llama.cpp repacked the weights (bindings/model.py says whether it did).
REPACKED_ROW_BLOCK = 4
# A draft row must promise this many times its cost: acceptance comes in runs (a copied passage
# is accepted until it ends), so a rate learned on a run overstates the next row. Without it,
# 16 streams drafted and lost 4-8% (bench speculative, paragraph and story at C=16, 2026-11-27:
# auto / off 0.94-0.99 and 0.84-0.95 over 4 trials); rows cost 0.94 of a token there.
DRAFT_GAIN_MARGIN = 1.2
# Under the per-token latency target drafts get the step's budget less this share. The target is
# a 95th percentile the calibration aims steps at; a plan of whole batch rows stops short of the
# budget by part of a row, and drafts that filled that rest put the intervals' p95 on the target
# instead (mixed-priority --every 1.5: 149.7-150.6 ms against 143.9-145.2 without speculation,
# target 150, bench/results/20261129T101215Z-versions). Judgement: about that rest.
DRAFT_TARGET_MARGIN = 0.05
# Drafts' measured payoff (engine/draft_payoff.py): decode steps with drafts against those without,
# per count of sequences decoding. At 16 streams drafted steps took 175-276 ms against a plain
# step's 143 and made 1-6 tokens more (2026-11-29). At one stream a drafted step either gains
# many tokens or loses one row's cost, so a verdict needs many of them: after 4 (and a short
# average) drafts on the function rewrite stopped at its first misses and the stream ran at 0.97
# of no drafts, against 1.19 without the check (runs 075531Z, 065919Z). After 256 plain steps
# drafts are tried again there (judgement). Not at one stream: its drafted steps vary its rows,
# so the fit sees a row's cost there; and plain steps of a JSON job (jump-forward's runs) made it
# stop drafts for the next workload (paragraph 1.29 of off against 1.58, run 080156Z).
PAYOFF_MIN_STEPS, PAYOFF_WEIGHT, PAYOFF_RETRY_STEPS = 16, 0.05, 256
# The moving average of a draft row's measured cost (engine/draft_payoff.py) weighs each drafted
# step of two or more streams this much. At 16 streams (story, in process, 2026-11-30) draft rows
# added 5.5-15 ms each to a 75 ms step, where the fit priced them at 3.6-4.1 ms; per step the
# figure moves by a few ms, so a few steps settle it (judgement).
DRAFT_ROW_WEIGHT = 0.2
PAYOFF_MIN_STREAMS = 2

# ---- the draft model (engine/draft_model.py) ----------------------------------------------------
# A draft model stops extending a draft at a token it gives less than this probability: each
# drafted position costs it a decode and the main step a row (llama.cpp has the same cut,
# `--draft-p-min`, off by default in the version we pin; the value is judgement).
DRAFT_MODEL_P_MIN = 0.75
# Its drafts are also cut at this many tokens, each costing it a decode, whatever
# `speculative_max_draft` allows the model-free sources (llama.cpp's `--draft-max` default is 16;
# one fewer for a multiple of four output rows, as with DRAFT_CAP_START).
DRAFT_MODEL_MAX_DRAFT = 15
# Rows of one catch-up decode in the draft model's context (a new sequence's prompt is fed in
# pieces of this size; judgement, the main context's default step budget is 256).
DRAFT_MODEL_CATCH_UP_ROWS = 512
