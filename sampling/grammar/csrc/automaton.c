/* Subset construction, live states and minimisation for sampling/grammar/dfa.py, and the
   token edges of distance.py.

   The same algorithms as the Python they replaced, written in C because a large schema's
   automaton has tens of thousands of states and Python spent ~15 us on each. Plain C99, no
   dependencies; results allocated here are freed by the caller (subset_free, pairs_free). */
#include <stdlib.h>
#include <string.h>

#include "automaton.h"

/* ---- growable int32 vector ---- */

typedef struct { int32_t *v; int64_t n, cap; } vec;

static int vec_grow(vec *a, int64_t need) {
    int64_t cap = a->cap ? a->cap : 64;
    while (cap < need) cap *= 2;
    int32_t *p = realloc(a->v, (size_t)cap * sizeof(int32_t));
    if (!p) return 0;
    a->v = p;
    a->cap = cap;
    return 1;
}

/* Inline fast paths: pushes are the inner loops' commonest call. */
static inline int vec_reserve(vec *a, int64_t need) {
    return need <= a->cap || vec_grow(a, need);
}

static inline int vec_push(vec *a, int32_t x) {
    if (a->n == a->cap && !vec_grow(a, a->n + 1)) return 0;
    a->v[a->n++] = x;
    return 1;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void sort_i32(int32_t *v, int64_t n) {
    if (n < 24) {                       /* sets are mostly tiny */
        for (int64_t i = 1; i < n; i++) {
            int32_t x = v[i];
            int64_t j = i;
            while (j > 0 && v[j - 1] > x) { v[j] = v[j - 1]; j--; }
            v[j] = x;
        }
    } else {
        qsort(v, (size_t)n, sizeof(int32_t), cmp_i32);
    }
}

/* (key, value) pairs sorted by key, for grouping edges by mask and calls by rule. */
static int cmp_pair(const void *a, const void *b) {
    const int32_t *x = a, *y = b;
    if (x[0] != y[0]) return (x[0] > y[0]) - (x[0] < y[0]);
    return (x[1] > y[1]) - (x[1] < y[1]);
}

static void sort_pairs(int32_t *v, int64_t n) {
    if (n >= 24) {
        qsort(v, (size_t)n, 2 * sizeof(int32_t), cmp_pair);
        return;
    }
    for (int64_t i = 1; i < n; i++) {   /* a state's few edges: insertion sort, no calls */
        int32_t k = v[2 * i], x = v[2 * i + 1];
        int64_t j = i;
        while (j > 0 && (v[2 * j - 2] > k || (v[2 * j - 2] == k && v[2 * j - 1] > x))) {
            v[2 * j] = v[2 * j - 2];
            v[2 * j + 1] = v[2 * j - 1];
            j--;
        }
        v[2 * j] = k;
        v[2 * j + 1] = x;
    }
}

/* ---- the construction's state ---- */

typedef struct {
    /* the NFA */
    const int32_t *eps_off, *eps_dst, *edge_off, *edge_mask, *edge_dst;
    const int32_t *call_off, *call_rule, *call_dst, *tag;
    const uint8_t *mask_cls;
    int32_t n_nfa, n_cls, max_states;
    /* scratch over NFA states */
    int32_t *mark, stamp, *stack, *closed;
    int64_t n_closed;
    /* DFA states: their NFA sets (pool[set_off[g] .. set_off[g] + set_len[g]]) and tables */
    vec pool, set_off, set_len, trans, rule_of, count_tag, calls, todo;
    vec accept;                 /* as int32, narrowed at the end */
    int32_t *table;             /* open addressing: DFA state id or -1 */
    int64_t table_cap;
    int32_t rule, rule_end;
    int error;
} builder;

static uint64_t hash_set(int32_t rule, const int32_t *s, int64_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)(uint32_t)rule;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)s[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

/* The epsilon closure of the given NFA states, sorted, into b->closed. */
static void closure(builder *b, const int32_t *from, int64_t n) {
    b->stamp++;
    b->n_closed = 0;
    int64_t top = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t s = from[i];
        if (b->mark[s] != b->stamp) { b->mark[s] = b->stamp; b->stack[top++] = s; }
    }
    while (top) {
        int32_t s = b->stack[--top];
        b->closed[b->n_closed++] = s;
        for (int32_t k = b->eps_off[s]; k < b->eps_off[s + 1]; k++) {
            int32_t t = b->eps_dst[k];
            if (b->mark[t] != b->stamp) { b->mark[t] = b->stamp; b->stack[top++] = t; }
        }
    }
    sort_i32(b->closed, b->n_closed);
}

static int grow_table(builder *b) {
    int64_t cap = b->table_cap ? b->table_cap * 2 : 1024;
    int32_t *t = malloc((size_t)cap * sizeof(int32_t));
    if (!t) return 0;
    memset(t, 0xff, (size_t)cap * sizeof(int32_t));
    for (int64_t g = 1; g < b->set_off.n; g++) {
        uint64_t h = hash_set(b->rule_of.v[g], b->pool.v + b->set_off.v[g], b->set_len.v[g]);
        int64_t i = (int64_t)(h & (uint64_t)(cap - 1));
        while (t[i] >= 0) i = (i + 1) & (cap - 1);
        t[i] = (int32_t)g;
    }
    free(b->table);
    b->table = t;
    b->table_cap = cap;
    return 1;
}

/* The DFA state of the current rule whose NFA set is b->closed (made if new); 0 if empty. */
static int32_t intern(builder *b) {
    const int32_t *s = b->closed;
    int64_t n = b->n_closed;
    if (n == 0) return 0;
    uint64_t h = hash_set(b->rule, s, n);
    int64_t i = (int64_t)(h & (uint64_t)(b->table_cap - 1));
    for (; b->table[i] >= 0; i = (i + 1) & (b->table_cap - 1)) {
        int32_t g = b->table[i];
        if (b->rule_of.v[g] == b->rule && b->set_len.v[g] == n
            && memcmp(b->pool.v + b->set_off.v[g], s, (size_t)n * sizeof(int32_t)) == 0)
            return g;
    }
    int32_t g = (int32_t)b->set_off.n;
    if (g > b->max_states) { b->error = AUTOMATON_TOO_LARGE; return 0; }
    int32_t found_tag = 0, accept = 0;
    for (int64_t k = 0; k < n; k++) {
        int32_t t = b->tag[s[k]];
        if (t) {
            if (found_tag && found_tag != t) { b->error = AUTOMATON_COUNT_CONFLICT; return 0; }
            found_tag = t;
        }
        if (s[k] == b->rule_end) accept = 1;
    }
    int ok = vec_push(&b->set_off, (int32_t)b->pool.n) && vec_push(&b->set_len, (int32_t)n)
        && vec_reserve(&b->pool, b->pool.n + n) && vec_push(&b->rule_of, b->rule)
        && vec_push(&b->count_tag, found_tag) && vec_push(&b->accept, accept)
        && vec_reserve(&b->trans, b->trans.n + b->n_cls) && vec_push(&b->todo, g);
    if (!ok) { b->error = AUTOMATON_NO_MEMORY; return 0; }
    memcpy(b->pool.v + b->pool.n, s, (size_t)n * sizeof(int32_t));
    b->pool.n += n;
    memset(b->trans.v + b->trans.n, 0, (size_t)b->n_cls * sizeof(int32_t));
    b->trans.n += b->n_cls;
    b->table[i] = g;
    if (2 * (int64_t)g >= b->table_cap && !grow_table(b)) { b->error = AUTOMATON_NO_MEMORY; return 0; }
    return g;
}

/* Fill state g's row and call edges. */
static int expand(builder *b, int32_t g, vec *cur, vec *pairs, vec *bucket, vec *sigs, vec *sig_target) {
    int64_t n = b->set_len.v[g];
    cur->n = 0;
    if (!vec_reserve(cur, n)) return 0;
    memcpy(cur->v, b->pool.v + b->set_off.v[g], (size_t)n * sizeof(int32_t));
    cur->n = n;

    /* Edges grouped by label: runs of (mask, target) pairs. */
    pairs->n = 0;
    for (int64_t k = 0; k < n; k++) {
        int32_t s = cur->v[k];
        for (int32_t e = b->edge_off[s]; e < b->edge_off[s + 1]; e++)
            if (!vec_push(pairs, b->edge_mask[e]) || !vec_push(pairs, b->edge_dst[e])) return 0;
    }
    int64_t n_pairs = pairs->n / 2;
    sort_pairs(pairs->v, n_pairs);
    /* run starts, reusing `bucket` as scratch after the runs are listed in `sigs` head */
    vec runs = {0};
    for (int64_t p = 0; p < n_pairs; p++)
        if (p == 0 || pairs->v[2 * p] != pairs->v[2 * p - 2])
            if (!vec_push(&runs, (int32_t)p)) { free(runs.v); return 0; }
    int64_t n_runs = runs.n;
    if (!vec_push(&runs, (int32_t)n_pairs)) { free(runs.v); return 0; }

    /* Classes with the same set of runs go to the same state: a signature is that set, as
       bits; each distinct signature is closed and interned once. */
    int64_t words = (n_runs + 63) / 64;
    if (words == 0) words = 1;
    sigs->n = 0;
    sig_target->n = 0;
    uint64_t *sig = calloc((size_t)words, sizeof(uint64_t));
    if (!sig) { free(runs.v); return 0; }
    for (int32_t c = 0; c < b->n_cls; c++) {
        memset(sig, 0, (size_t)words * sizeof(uint64_t));
        int any = 0;
        for (int64_t r = 0; r < n_runs; r++) {
            int32_t m = pairs->v[2 * runs.v[r]];
            if (b->mask_cls[(int64_t)m * b->n_cls + c]) { sig[r / 64] |= 1ULL << (r % 64); any = 1; }
        }
        if (!any) continue;
        int64_t n_sigs = sig_target->n, found = -1;
        for (int64_t j = 0; j < n_sigs && found < 0; j++)
            if (memcmp(sigs->v + j * 2 * words, sig, (size_t)words * sizeof(uint64_t)) == 0) found = j;
        int32_t target;
        if (found >= 0) {
            target = sig_target->v[found];
        } else {
            bucket->n = 0;
            for (int64_t r = 0; r < n_runs; r++)
                if (sig[r / 64] >> (r % 64) & 1)
                    for (int32_t p = runs.v[r]; p < runs.v[r + 1]; p++)
                        if (!vec_push(bucket, pairs->v[2 * p + 1])) { free(sig); free(runs.v); return 0; }
            closure(b, bucket->v, bucket->n);
            target = intern(b);
            if (b->error) { free(sig); free(runs.v); return 1; }
            if (!vec_reserve(sigs, sigs->n + 2 * words) || !vec_push(sig_target, target)) {
                free(sig); free(runs.v); return 0;
            }
            memcpy(sigs->v + sigs->n, sig, (size_t)words * sizeof(uint64_t));
            sigs->n += 2 * words;
        }
        b->trans.v[(int64_t)g * b->n_cls + c] = target;
    }
    free(sig);
    free(runs.v);

    /* Call edges: per called rule, the closure of all return targets. */
    pairs->n = 0;
    for (int64_t k = 0; k < n; k++) {
        int32_t s = cur->v[k];
        for (int32_t e = b->call_off[s]; e < b->call_off[s + 1]; e++)
            if (!vec_push(pairs, b->call_rule[e]) || !vec_push(pairs, b->call_dst[e])) return 0;
    }
    n_pairs = pairs->n / 2;
    sort_pairs(pairs->v, n_pairs);
    for (int64_t p = 0; p < n_pairs;) {
        int32_t q = pairs->v[2 * p];
        bucket->n = 0;
        for (; p < n_pairs && pairs->v[2 * p] == q; p++)
            if (!vec_push(bucket, pairs->v[2 * p + 1])) return 0;
        closure(b, bucket->v, bucket->n);
        int32_t ret = intern(b);
        if (b->error) return 1;
        if (ret && (!vec_push(&b->calls, g) || !vec_push(&b->calls, q) || !vec_push(&b->calls, ret))) return 0;
    }
    return 1;
}

int subset_construct(int32_t n_nfa,
                     const int32_t *eps_off, const int32_t *eps_dst,
                     const int32_t *edge_off, const int32_t *edge_mask, const int32_t *edge_dst,
                     int32_t n_masks, int32_t n_cls, const uint8_t *mask_cls,
                     const int32_t *call_off, const int32_t *call_rule, const int32_t *call_dst,
                     const int32_t *tag,
                     int32_t n_rules, const int32_t *rule_start, const int32_t *rule_end,
                     int32_t max_states, subset_result *out) {
    (void)n_masks;
    builder b = {0};
    b.eps_off = eps_off; b.eps_dst = eps_dst;
    b.edge_off = edge_off; b.edge_mask = edge_mask; b.edge_dst = edge_dst;
    b.call_off = call_off; b.call_rule = call_rule; b.call_dst = call_dst;
    b.tag = tag; b.mask_cls = mask_cls;
    b.n_nfa = n_nfa; b.n_cls = n_cls; b.max_states = max_states;
    memset(out, 0, sizeof(*out));
    vec cur = {0}, pairs = {0}, bucket = {0}, sigs = {0}, sig_target = {0};
    int32_t *starts = malloc((size_t)(n_rules > 0 ? n_rules : 1) * sizeof(int32_t));
    b.mark = calloc((size_t)n_nfa + 1, sizeof(int32_t));
    b.stack = malloc(((size_t)n_nfa + 1) * sizeof(int32_t));
    b.closed = malloc(((size_t)n_nfa + 1) * sizeof(int32_t));
    int ok = starts && b.mark && b.stack && b.closed && grow_table(&b);
    /* state 0: dead */
    ok = ok && vec_push(&b.set_off, 0) && vec_push(&b.set_len, 0) && vec_push(&b.rule_of, -1)
        && vec_push(&b.count_tag, 0) && vec_push(&b.accept, 0) && vec_reserve(&b.trans, n_cls);
    if (ok) {
        memset(b.trans.v, 0, (size_t)n_cls * sizeof(int32_t));
        b.trans.n = n_cls;
    }
    for (int32_t r = 0; ok && !b.error && r < n_rules; r++) {
        b.rule = r;
        b.rule_end = rule_end[r];
        closure(&b, &rule_start[r], 1);
        starts[r] = intern(&b);
        while (ok && !b.error && b.todo.n) {
            int32_t g = b.todo.v[--b.todo.n];
            ok = expand(&b, g, &cur, &pairs, &bucket, &sigs, &sig_target);
        }
    }
    int status = !ok ? AUTOMATON_NO_MEMORY : b.error;
    free(cur.v); free(pairs.v); free(bucket.v); free(sigs.v); free(sig_target.v);
    free(b.mark); free(b.stack); free(b.closed); free(b.table);
    free(b.pool.v); free(b.set_off.v); free(b.set_len.v); free(b.todo.v);
    uint8_t *accept = NULL;
    if (status == AUTOMATON_OK) {
        accept = malloc((size_t)b.accept.n);
        if (!accept) status = AUTOMATON_NO_MEMORY;
        else for (int64_t g = 0; g < b.accept.n; g++) accept[g] = (uint8_t)b.accept.v[g];
    }
    free(b.accept.v);
    if (status != AUTOMATON_OK) {
        free(starts); free(b.trans.v); free(b.rule_of.v); free(b.count_tag.v); free(b.calls.v);
        return status;
    }
    out->n_states = (int32_t)b.rule_of.n;
    out->trans = b.trans.v;
    out->accept = accept;
    out->rule_of = b.rule_of.v;
    out->count_tag = b.count_tag.v;
    out->n_calls = (int32_t)(b.calls.n / 3);
    out->calls = b.calls.v;
    out->starts = starts;
    return AUTOMATON_OK;
}

void automaton_free(void *p) { free(p); }

void subset_free(subset_result *out) {
    free(out->trans); free(out->accept); free(out->rule_of); free(out->count_tag);
    free(out->calls); free(out->starts);
    memset(out, 0, sizeof(*out));
}

/* CSR of `count` items keyed by key[i] in [0, n_keys): first[k] .. first[k + 1] index items. */
static int group_by(int64_t count, const int32_t *key, int32_t n_keys, int64_t **first_out, int32_t **items_out) {
    int64_t *first = calloc((size_t)n_keys + 1, sizeof(int64_t));
    int32_t *items = malloc((size_t)(count ? count : 1) * sizeof(int32_t));
    int64_t *fill = malloc(((size_t)n_keys + 1) * sizeof(int64_t));
    if (!first || !items || !fill) { free(first); free(items); free(fill); return 0; }
    for (int64_t i = 0; i < count; i++) first[key[i] + 1]++;
    for (int32_t k = 0; k < n_keys; k++) first[k + 1] += first[k];
    memcpy(fill, first, ((size_t)n_keys + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < count; i++) items[fill[key[i]]++] = (int32_t)i;
    free(fill);
    *first_out = first;
    *items_out = items;
    return 1;
}

int live_states(int32_t n, int32_t n_cls, const int32_t *trans, const uint8_t *accept,
                int32_t n_calls, const int32_t *call_src, const int32_t *call_rule, const int32_t *call_dst,
                int32_t n_rules, const int32_t *rule_start, uint8_t *live, uint8_t *productive) {
    /* byte edges reversed: for each target, its sources (once per run of equal targets in a row) */
    vec edge_dst = {0}, edge_src = {0};
    for (int64_t s = 1; s < n; s++) {
        int32_t last = 0;
        for (int32_t c = 0; c < n_cls; c++) {
            int32_t t = trans[s * n_cls + c];
            if (t && t != last && (!vec_push(&edge_dst, t) || !vec_push(&edge_src, (int32_t)s))) {
                free(edge_dst.v); free(edge_src.v);
                return AUTOMATON_NO_MEMORY;
            }
            last = t;
        }
    }
    int64_t *pred_first = NULL, *ret_first = NULL, *rule_first = NULL, *start_first = NULL;
    int32_t *pred = NULL, *by_ret = NULL, *by_rule = NULL, *starting = NULL;
    int32_t *queue = malloc(((size_t)n + 1) * sizeof(int32_t));
    int ok = queue && group_by(edge_dst.n, edge_dst.v, n, &pred_first, &pred)
        && group_by(n_calls, call_dst, n, &ret_first, &by_ret)
        && group_by(n_calls, call_rule, n_rules, &rule_first, &by_rule)
        && group_by(n_rules, rule_start, n, &start_first, &starting);
    if (ok) {
        int64_t head = 0, tail = 0;
        memset(live, 0, (size_t)n);
        memset(productive, 0, (size_t)n_rules);
        for (int32_t s = 1; s < n; s++)
            if (accept[s]) { live[s] = 1; queue[tail++] = s; }
#define MARK(x) do { int32_t x_ = (x); if (x_ && !live[x_]) { live[x_] = 1; queue[tail++] = x_; } } while (0)
        while (head < tail) {
            int32_t t = queue[head++];
            for (int64_t k = pred_first[t]; k < pred_first[t + 1]; k++) MARK(edge_src.v[pred[k]]);
            for (int64_t k = ret_first[t]; k < ret_first[t + 1]; k++)
                if (productive[call_rule[by_ret[k]]]) MARK(call_src[by_ret[k]]);
            for (int64_t k = start_first[t]; k < start_first[t + 1]; k++) {
                int32_t r = starting[k];
                if (productive[r]) continue;
                productive[r] = 1;
                for (int64_t j = rule_first[r]; j < rule_first[r + 1]; j++)
                    if (live[call_dst[by_rule[j]]]) MARK(call_src[by_rule[j]]);
            }
        }
#undef MARK
    }
    free(edge_dst.v); free(edge_src.v); free(queue);
    free(pred_first); free(pred); free(ret_first); free(by_ret);
    free(rule_first); free(by_rule); free(start_first); free(starting);
    return ok ? AUTOMATON_OK : AUTOMATON_NO_MEMORY;
}

/* ---- minimisation: Valmari and Lehtinen's partition refinement (Hopcroft's algorithm for
   partial automata, O(m log n)); blocks partition the states, cords the transitions ---- */

typedef struct {
    int32_t z;                       /* number of sets */
    int32_t *elems, *loc, *set, *first, *past, *marked, *touched;
    int32_t n_touched;
} refinable;

static int refinable_init(refinable *p, int32_t n, const int32_t *key, int32_t n_keys) {
    size_t sets = (size_t)(n > n_keys ? n : n_keys) + 1;    /* at most one set per element, */
    p->elems = malloc(((size_t)n + 1) * sizeof(int32_t));    /* after the empty keys are gone */
    p->loc = malloc(((size_t)n + 1) * sizeof(int32_t));
    p->set = malloc(((size_t)n + 1) * sizeof(int32_t));
    p->first = calloc(sets, sizeof(int32_t));
    p->past = calloc(sets, sizeof(int32_t));
    p->marked = calloc(sets, sizeof(int32_t));
    p->touched = malloc(sets * sizeof(int32_t));
    p->n_touched = 0;
    if (!p->elems || !p->loc || !p->set || !p->first || !p->past || !p->marked || !p->touched) return 0;
    /* counting sort of the elements by key: set k holds the elements with key k */
    for (int32_t e = 0; e < n; e++) p->past[key[e]]++;
    int32_t at = 0;
    for (int32_t k = 0; k < n_keys; k++) {
        p->first[k] = at;
        at += p->past[k];
        p->past[k] = p->first[k];
    }
    for (int32_t e = 0; e < n; e++) {
        int32_t k = key[e];
        p->elems[p->past[k]] = e;
        p->loc[e] = p->past[k]++;
    }
    /* keys no element has make no set */
    int32_t z = 0;
    for (int32_t k = 0; k < n_keys; k++)
        if (p->past[k] > p->first[k]) {
            p->first[z] = p->first[k];
            p->past[z] = p->past[k];
            for (int32_t i = p->first[z]; i < p->past[z]; i++) p->set[p->elems[i]] = z;
            z++;
        }
    p->z = z;
    return 1;
}

static void refinable_free(refinable *p) {
    free(p->elems); free(p->loc); free(p->set); free(p->first); free(p->past); free(p->marked); free(p->touched);
}

static void mark(refinable *p, int32_t e) {
    int32_t s = p->set[e], i = p->loc[e], j = p->first[s] + p->marked[s];
    p->elems[i] = p->elems[j];
    p->loc[p->elems[i]] = i;
    p->elems[j] = e;
    p->loc[e] = j;
    if (!p->marked[s]++) p->touched[p->n_touched++] = s;
}

/* Split every touched set into its marked and unmarked parts; the smaller part becomes new. */
static void split(refinable *p) {
    while (p->n_touched) {
        int32_t s = p->touched[--p->n_touched], j = p->first[s] + p->marked[s];
        if (j == p->past[s]) { p->marked[s] = 0; continue; }
        int32_t z = p->z;
        if (p->marked[s] <= p->past[s] - j) {
            p->first[z] = p->first[s];
            p->past[z] = p->first[s] = j;
        } else {
            p->past[z] = p->past[s];
            p->first[z] = p->past[s] = j;
        }
        for (int32_t i = p->first[z]; i < p->past[z]; i++) p->set[p->elems[i]] = z;
        p->marked[s] = p->marked[z] = 0;
        p->z++;
    }
}

int32_t minimize(int32_t n, int32_t n_cls, const int32_t *trans,
                 int32_t n_extra, const int32_t *extra_src, const int32_t *extra_label,
                 const int32_t *extra_dst, int32_t n_extra_labels,
                 const int32_t *first_block, int32_t n_first, int32_t *block) {
    int64_t m = n_extra;
    for (int64_t s = 1; s < n; s++)
        for (int32_t c = 0; c < n_cls; c++) m += trans[s * n_cls + c] != 0;
    if (m >= INT32_MAX) return -1;
    int32_t n_labels = n_cls + n_extra_labels;
    int32_t *tail = malloc(((size_t)m + 1) * sizeof(int32_t));
    int32_t *label = malloc(((size_t)m + 1) * sizeof(int32_t));
    int32_t *head = malloc(((size_t)m + 1) * sizeof(int32_t));
    int32_t *in_first = calloc((size_t)n + 2, sizeof(int32_t));   /* incoming transitions, CSR */
    int32_t *in_list = malloc(((size_t)m + 1) * sizeof(int32_t));
    refinable blocks = {0}, cords = {0};
    int32_t result = -1;
    if (!tail || !label || !head || !in_first || !in_list) goto done;
    int32_t t = 0;
    for (int64_t s = 1; s < n; s++)
        for (int32_t c = 0; c < n_cls; c++) {
            int32_t d = trans[s * n_cls + c];
            if (d) { tail[t] = (int32_t)s; label[t] = c; head[t] = d; t++; }
        }
    for (int32_t k = 0; k < n_extra; k++) {
        tail[t] = extra_src[k]; label[t] = n_cls + extra_label[k]; head[t] = extra_dst[k]; t++;
    }
    for (int32_t k = 0; k < m; k++) in_first[head[k] + 1]++;
    for (int32_t s = 0; s < n; s++) in_first[s + 1] += in_first[s];
    for (int32_t k = 0; k < m; k++) in_list[in_first[head[k]]++] = k;
    for (int32_t s = n; s > 0; s--) in_first[s] = in_first[s - 1];
    in_first[0] = 0;
    if (!refinable_init(&blocks, n, first_block, n_first)) goto done;
    if (!refinable_init(&cords, (int32_t)m, label, n_labels)) goto done;
    int32_t b = 1, c = 0;
    while (c < cords.z) {
        for (int32_t i = cords.first[c]; i < cords.past[c]; i++) mark(&blocks, tail[cords.elems[i]]);
        split(&blocks);
        c++;
        while (b < blocks.z) {
            for (int32_t i = blocks.first[b]; i < blocks.past[b]; i++) {
                int32_t q = blocks.elems[i];
                for (int32_t j = in_first[q]; j < in_first[q + 1]; j++) mark(&cords, in_list[j]);
            }
            split(&cords);
            b++;
        }
    }
    for (int32_t s = 0; s < n; s++) block[s] = blocks.set[s];
    result = blocks.z;
done:
    free(tail); free(label); free(head); free(in_first); free(in_list);
    refinable_free(&blocks); refinable_free(&cords);
    return result;
}

void quotient_table(int32_t n_out, int32_t n_cls, const int32_t *trans, const int64_t *rep,
                    const int32_t *block, int32_t *out) {
    for (int32_t i = 0; i < n_out; i++) {
        const int32_t *from = trans + rep[i] * n_cls;
        int32_t *to = out + (int64_t)i * n_cls;
        for (int32_t c = 0; c < n_cls; c++)
            to[c] = block[from[c]];
    }
}

/* ---- token edges: every state walks the token trie at once, pruned at the dead state ---- */

/* A trie node with many children, met in a state with few live columns (a key's letters), is
   walked through the state's columns (binary search among the children, which are in column
   order) instead of through its children: most of a large schema's states have one. */
#define FEW 4

typedef struct {
    const int32_t *trans;
    int32_t n_cls;
    uint8_t used[256];      /* the columns the trie uses */
    int n_used;
    int16_t *count;         /* per state: how many of `used` are live (-1: not yet counted) */
    uint8_t *few;           /* per state: the first FEW of them */
} live_bytes;

static int live_count(live_bytes *lb, int32_t s) {
    if (lb->count[s] < 0) {
        int m = 0;
        const int32_t *row = lb->trans + (int64_t)s * lb->n_cls;
        for (int i = 0; i < lb->n_used; i++)
            if (row[lb->used[i]]) {
                if (m < FEW) lb->few[(int64_t)s * FEW + m] = lb->used[i];
                m++;
            }
        lb->count[s] = (int16_t)m;
    }
    return lb->count[s];
}

static int32_t child_with_byte(const uint8_t *child_byte, int32_t lo, int32_t hi, uint8_t b) {
    int32_t end = hi;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (child_byte[mid] < b) lo = mid + 1;
        else hi = mid;
    }
    return lo < end && child_byte[lo] == b ? lo : -1;
}

int token_edges(int32_t n, int32_t n_cls, const int32_t *trans, const uint8_t *counted, int32_t max_start_live,
                int32_t first, int32_t step, const int32_t *child_off, const uint8_t *child_byte, const int32_t *child_node,
                const uint8_t *is_token, pair_result *out) {
    memset(out, 0, sizeof(*out));
    vec src = {0}, dst = {0}, stack = {0}, todo = {0};
    live_bytes lb = {trans, n_cls, {0}, 0, malloc((size_t)n * sizeof(int16_t)), malloc((size_t)n * FEW)};
    int32_t *seen = calloc((size_t)n + 1, sizeof(int32_t));     /* seen[t] == s + 1: pair (s, t) out */
    int ok = seen != NULL && lb.count != NULL && lb.few != NULL && vec_push(&todo, 0);
    if (ok) {
        memset(lb.count, -1, (size_t)n * sizeof(int16_t));
        uint8_t is_used[256] = {0};
        while (todo.n) {                /* the columns the trie uses */
            int32_t node = todo.v[--todo.n];
            for (int32_t k = child_off[node]; ok && k < child_off[node + 1]; k++) {
                is_used[child_byte[k]] = 1;
                ok = vec_push(&todo, child_node[k]);
            }
        }
        for (int b = 0; b < 256; b++)
            if (is_used[b]) lb.used[lb.n_used++] = (uint8_t)b;
    }
    for (int32_t s = first > 1 ? first : 1; ok && s < n; s += step > 1 ? step : 1) {
        if (counted[s] || (max_start_live >= 0 && live_count(&lb, s) > max_start_live)) continue;
        stack.n = 0;
        ok = vec_push(&stack, 0) && vec_push(&stack, s);
        while (ok && stack.n) {
            int32_t cur = stack.v[--stack.n], node = stack.v[--stack.n];
            int32_t lo = child_off[node], hi = child_off[node + 1];
            int m = hi - lo > 2 * FEW ? live_count(&lb, cur) : FEW + 1;
            int32_t count = m <= FEW ? m : hi - lo;
            for (int32_t j = 0; ok && j < count; j++) {
                int32_t k = m <= FEW ? child_with_byte(child_byte, lo, hi, lb.few[(int64_t)cur * FEW + j]) : lo + j;
                if (k < 0) continue;
                int32_t next = trans[(int64_t)cur * n_cls + child_byte[k]];
                if (!next) continue;
                int32_t child = child_node[k];
                if (is_token[child] && seen[next] != s + 1) {
                    seen[next] = s + 1;
                    ok = ok && vec_push(&src, s) && vec_push(&dst, next);
                }
                if (child_off[child + 1] > child_off[child] && !counted[next])
                    ok = ok && vec_push(&stack, child) && vec_push(&stack, next);
            }
        }
    }
    free(seen);
    free(stack.v);
    free(todo.v);
    free(lb.count);
    free(lb.few);
    if (!ok) { free(src.v); free(dst.v); return AUTOMATON_NO_MEMORY; }
    out->n_pairs = src.n;
    out->src = src.v;
    out->dst = dst.v;
    return AUTOMATON_OK;
}

void pairs_free(pair_result *out) {
    free(out->src); free(out->dst);
    memset(out, 0, sizeof(*out));
}


/* ------------------------------------------------------------------ shortest distances */

typedef struct {
    int64_t *key;           /* distance << 32 | state */
    int64_t size, cap;
} heap;

static int heap_push(heap *h, int64_t key) {
    if (h->size == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 1024;
        int64_t *grown = realloc(h->key, (size_t)cap * sizeof(int64_t));
        if (!grown)
            return 0;
        h->key = grown;
        h->cap = cap;
    }
    int64_t i = h->size++;
    while (i > 0 && h->key[(i - 1) / 2] > key) {
        h->key[i] = h->key[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->key[i] = key;
    return 1;
}

static int64_t heap_pop(heap *h) {
    int64_t top = h->key[0], last = h->key[--h->size];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= h->size)
            break;
        if (c + 1 < h->size && h->key[c + 1] < h->key[c])
            c++;
        if (h->key[c] >= last)
            break;
        h->key[i] = h->key[c];
        i = c;
    }
    if (h->size)
        h->key[i] = last;
    return top;
}

int shortest_distances(int32_t n, const int32_t *pred_off, const int32_t *pred, const uint8_t *accept,
                       const int32_t *hyper_g, const int32_t *hyper_a, const int32_t *hyper_b,
                       const int32_t *hyper_off, const int32_t *hyper, int32_t inf, int32_t *U) {
    heap h = {NULL, 0, 0};
    int ok = 1;
    for (int32_t x = 0; x < n; x++)
        U[x] = inf;
    for (int32_t x = 1; x < n && ok; x++)
        if (accept[x])
            ok = heap_push(&h, (int64_t)x);
    while (ok && h.size) {
        int64_t key = heap_pop(&h);
        int32_t x = (int32_t)(key & 0xffffffff), d = (int32_t)(key >> 32);
        if (U[x] != inf)
            continue;
        U[x] = d;
        for (int32_t k = pred_off[x]; k < pred_off[x + 1] && ok; k++)
            if (pred[k] != 0 && U[pred[k]] == inf)
                ok = heap_push(&h, ((int64_t)(d + 1) << 32) | pred[k]);
        for (int32_t k = hyper_off[x]; k < hyper_off[x + 1] && ok; k++) {
            int32_t e = hyper[k], g = hyper_g[e], a = hyper_a[e], b = hyper_b[e];
            if (g != 0 && U[g] == inf && U[a] != inf && U[b] != inf)
                ok = heap_push(&h, ((int64_t)(U[a] + U[b]) << 32) | g);
        }
    }
    free(h.key);
    return ok ? AUTOMATON_OK : AUTOMATON_NO_MEMORY;
}
