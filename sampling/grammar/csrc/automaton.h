/* Automaton construction loops that cost too much in Python (see automaton.c). */
#include <stdint.h>

typedef struct {
    int32_t n_states;       /* DFA states, state 0 being the dead state */
    int32_t *trans;         /* n_states x n_cls */
    uint8_t *accept;
    int32_t *rule_of;       /* -1 for the dead state */
    int32_t *count_tag;     /* the NFA tag its states carry, 0 for none */
    int32_t n_calls;
    int32_t *calls;         /* n_calls x 3: state, called rule, return state */
    int32_t *starts;        /* per rule */
} subset_result;

/* Return codes of subset_construct. */
#define AUTOMATON_OK 0
#define AUTOMATON_TOO_LARGE 1
#define AUTOMATON_COUNT_CONFLICT 2
#define AUTOMATON_NO_MEMORY 3

int subset_construct(int32_t n_nfa,
                     const int32_t *eps_off, const int32_t *eps_dst,
                     const int32_t *edge_off, const int32_t *edge_mask, const int32_t *edge_dst,
                     int32_t n_masks, int32_t n_cls, const uint8_t *mask_cls,
                     const int32_t *call_off, const int32_t *call_rule, const int32_t *call_dst,
                     const int32_t *tag,
                     int32_t n_rules, const int32_t *rule_start, const int32_t *rule_end,
                     int32_t max_states, subset_result *out);

void subset_free(subset_result *out);

/* free() for a buffer handed over to Python (subset_result.trans, left NULL there). */
void automaton_free(void *p);

/* The least fixpoint of: an accepting state is live; a state with a byte edge (trans: n x n_cls,
   target 0 = none) to a live state is live; a rule is productive when its start state is live;
   a state with a call edge (call_src -call(call_rule)-> call_dst) is live when the rule is
   productive and the return state live. Writes live[n] and productive[n_rules]. */
int live_states(int32_t n, int32_t n_cls, const int32_t *trans, const uint8_t *accept,
                int32_t n_calls, const int32_t *call_src, const int32_t *call_rule, const int32_t *call_dst,
                int32_t n_rules, const int32_t *rule_start, uint8_t *live, uint8_t *productive);

typedef struct {
    int64_t n_pairs;
    int32_t *src, *dst;
} pair_result;

/* The distinct (state, state') pairs such that some token of the trie leads state -> state'
   (trans: n x n_cls, 0 = dead; the trie spells tokens in columns, not bytes). The trie: node 0
   is the root, node k's children are child_node[child_off[k] .. child_off[k + 1]] on columns
   child_byte[...], in increasing order;
   is_token per node.
   A path may not start in, nor pass through, a state with counted[s] (it may end in one), nor
   start in one with more than max_start_live live columns among those the trie uses (< 0: any).
   Only paths from states first, first + step, ... (from 1 at least) are walked. */
int token_edges(int32_t n, int32_t n_cls, const int32_t *trans, const uint8_t *counted, int32_t max_start_live,
                int32_t first, int32_t step, const int32_t *child_off, const uint8_t *child_byte, const int32_t *child_node,
                const uint8_t *is_token, pair_result *out);

void pairs_free(pair_result *out);

/* The minimal automaton's table: out[i][c] = block[trans[rep[i]][c]] for i < n_out (trans and
   out: n_cls columns). */
void quotient_table(int32_t n_out, int32_t n_cls, const int32_t *trans, const int64_t *rep,
                    const int32_t *block, int32_t *out);

int32_t minimize(int32_t n, int32_t n_cls, const int32_t *trans,
                 int32_t n_extra, const int32_t *extra_src, const int32_t *extra_label,
                 const int32_t *extra_dst, int32_t n_extra_labels,
                 const int32_t *first_block, int32_t n_first, int32_t *block);

/* Fewest tokens from each state to acceptance (distance.py): unit edges p -> x, listed per
   target x as pred[pred_off[x] .. pred_off[x + 1]], and call hyperedges into g of weight
   U[a] + U[b], listed per input state as hyper[hyper_off[x] .. hyper_off[x + 1]] (indices into
   hyper_g / hyper_a / hyper_b). Accepting states are at 0; state 0 (dead) stays at inf; so does
   any state that cannot reach acceptance. Dijkstra with a binary heap. */
int shortest_distances(int32_t n, const int32_t *pred_off, const int32_t *pred, const uint8_t *accept,
                       const int32_t *hyper_g, const int32_t *hyper_a, const int32_t *hyper_b,
                       const int32_t *hyper_off, const int32_t *hyper, int32_t inf, int32_t *U);
