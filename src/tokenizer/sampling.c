/* sampling.c: the sampler (penalty, temperature, top-k, top-p, min-p, draw), its PRNG, and
 * stop-string scanning.
 *
 * Candidates live in one scratch array; each filter shrinks the live prefix cands[0..n).
 * Sorting a 250k vocabulary for every token would dominate decoding, so top-k keeps a heap
 * and top-p sorts only the tokens within a logit distance of the maximum that
 * already hold at least top_p of the probability mass (widening the distance until they
 * do): the tokens top-p keeps are always among those, so the result is the same as a full
 * sort's.
 *
 * Greedy picking and top-k (the settings of a chat) skip the candidate array: one pass over
 * the logits keeps the maximum, or the k first in a heap, reading a penalised token's
 * changed logit from a bitmap of the few the window holds. Writing 250k candidates and
 * filtering them cost 1.3 ms a token for greedy picking on this project's CI machine, the
 * pass a fraction of it; the server samples every token of every stream. */
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/sampling.h"

/* ---- sampler ---- */

struct lt_sampler_params lt_sampler_default_params(void)
{
    return (struct lt_sampler_params){.temperature = 1.0f,
                                      .top_k = 0,
                                      .top_p = 1.0f,
                                      .min_p = 0.0f,
                                      .repeat_penalty = 1.0f,
                                      .repeat_last_n = 64,
                                      .seed = 0};
}

lt_status lt_sampler_init(struct lt_sampler *s, const struct lt_sampler_params *p)
{
    memset(s, 0, sizeof(*s));
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) || isnan(p->repeat_penalty) ||
        isnan(p->presence_penalty) || isnan(p->frequency_penalty))
        return lt_fail(LT_ERR_INVALID, "sampler: a parameter is NaN");
    if (p->top_p <= 0)
        return lt_fail(LT_ERR_INVALID, "sampler: top_p %g must be > 0", (double)p->top_p);
    if (p->min_p < 0 || p->min_p > 1)
        return lt_fail(LT_ERR_INVALID, "sampler: min_p %g must be within [0, 1]", (double)p->min_p);
    if (p->repeat_penalty <= 0)
        return lt_fail(LT_ERR_INVALID, "sampler: repeat_penalty %g must be > 0",
                       (double)p->repeat_penalty);
    s->params = *p;
    lt_rng_seed(&s->rng, p->seed);
    return LT_OK;
}

void lt_sampler_free(struct lt_sampler *s)
{
    free(s->cands);
    free(s->seen);
    free(s->pen_bits);
    free(s->adj);
    memset(s, 0, sizeof(*s));
}

/* Descending by logit, ascending by id. */
static bool cand_before(const struct lt_sampler_cand *a, const struct lt_sampler_cand *b)
{
    return a->logit != b->logit ? a->logit > b->logit : a->id < b->id;
}

static int cand_cmp(const void *pa, const void *pb)
{
    const struct lt_sampler_cand *a = pa, *b = pb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

static void swap_cand(struct lt_sampler_cand *a, struct lt_sampler_cand *b)
{
    struct lt_sampler_cand t = *a;
    *a = *b;
    *b = t;
}

static float max_logit(const struct lt_sampler_cand *c, size_t n)
{
    float m = c[0].logit;
    for (size_t i = 1; i < n; i++)
        if (c[i].logit > m)
            m = c[i].logit;
    return m;
}

/* Keeps the smallest prefix (by probability) whose mass reaches top_p. */
static size_t apply_top_p(struct lt_sampler_cand *c, size_t n, float top_p)
{
    float m = max_logit(c, n);
    double z = 0;
    for (size_t i = 0; i < n; i++)
        z += expf(c[i].logit - m);
    double target = (double)top_p * z;
    size_t k = n;
    for (double d = 8; d < 1e30; d *= 2) {
        size_t j = 0;
        double mass = 0;
        for (size_t i = 0; i < n; i++)
            if ((double)c[i].logit >= m - d) {
                mass += expf(c[i].logit - m);
                swap_cand(&c[i], &c[j++]);
            }
        if (mass >= target || j == n) {
            k = j;
            break;
        }
    }
    qsort(c, k, sizeof(*c), cand_cmp);
    double cum = 0;
    for (size_t i = 0; i < k; i++) {
        cum += expf(c[i].logit - m);
        if (cum >= target)
            return i + 1;
    }
    return k;
}

static size_t apply_min_p(struct lt_sampler_cand *c, size_t n, float min_p)
{
    float m = max_logit(c, n);
    double cut = log((double)min_p); /* p / p_max >= min_p  <=>  l - m >= log(min_p) */
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if ((double)c[i].logit - m >= cut)
            c[j++] = c[i];
    return j ? j : 1; /* the maximum always passes; j == 0 cannot happen */
}

/* One candidate by its probability. e (scratch of n floats) keeps each exp, computed once
 * in float (summed in double): the 250k exps of a whole vocabulary are most of the cost. */
static lt_token draw(const struct lt_sampler_cand *c, size_t n, struct lt_rng *rng, float *e)
{
    float m = max_logit(c, n);
    double z = 0;
    for (size_t i = 0; i < n; i++) {
        e[i] = expf(c[i].logit - m);
        z += e[i];
    }
    double u = lt_rng_uniform(rng) * z, cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += e[i];
        if (u < cum)
            return c[i].id;
    }
    return c[n - 1].id; /* rounding left u at the very top */
}

static bool pen_bit(const uint64_t *bits, size_t i) { return bits[i >> 6] >> (i & 63) & 1; }

/* Scratch for n_vocab candidates (grown, never shrunk). */
static lt_status reserve(struct lt_sampler *s, size_t n_vocab)
{
    if (n_vocab <= s->cap)
        return LT_OK;
    struct lt_sampler_cand *c = realloc(s->cands, n_vocab * sizeof(*c));
    if (c)
        s->cands = c;
    uint32_t *seen = realloc(s->seen, n_vocab * sizeof(*seen));
    if (seen)
        s->seen = seen;
    uint64_t *bits = realloc(s->pen_bits, (n_vocab / 64 + 1) * sizeof(*bits));
    if (bits)
        s->pen_bits = bits;
    float *adj = realloc(s->adj, n_vocab * sizeof(*adj));
    if (adj)
        s->adj = adj;
    if (!c || !seen || !bits || !adj)
        return lt_fail(LT_ERR_NOMEM, "sampler: out of memory for %zu candidates", n_vocab);
    memset(s->seen, 0, n_vocab * sizeof(*seen));
    memset(s->pen_bits, 0, (n_vocab / 64 + 1) * sizeof(*bits));
    s->cap = n_vocab;
    return LT_OK;
}

/* The penalised logits of the window's tokens: s->adj[id] with id's bit set in s->pen_bits
 * (the caller clears the bits with unmark_penalties). *marked: whether any is. */
static lt_status mark_penalties(struct lt_sampler *s, const float *logits, size_t n_vocab,
                                const lt_token *history, size_t n_history, bool *marked)
{
    const struct lt_sampler_params *p = &s->params;
    const bool repeat = p->repeat_penalty != 1.0f,
               counted = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    *marked = false;
    if (!(repeat || counted) || !n_history)
        return LT_OK;
    size_t from = (p->repeat_last_n < 0 || (size_t)p->repeat_last_n >= n_history)
                      ? 0
                      : n_history - (size_t)p->repeat_last_n;
    for (size_t i = from; i < n_history; i++)
        if (history[i] < 0 || (size_t)history[i] >= n_vocab)
            return lt_fail(LT_ERR_INVALID,
                           "sampler: history token %zu is id %d, outside "
                           "the vocabulary (%zu)",
                           i, history[i], n_vocab);
    for (size_t i = from; i < n_history; i++)
        s->seen[history[i]]++;
    /* each token once, at its first place in the window; its count goes back to 0, which
     * leaves the scratch clean */
    for (size_t i = from; i < n_history; i++) {
        const lt_token id = history[i];
        const uint32_t k = s->seen[id];
        if (!k)
            continue;
        s->seen[id] = 0;
        float l = logits[id];
        if (repeat)
            l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        if (counted)
            l -= (float)k * p->frequency_penalty + p->presence_penalty;
        s->adj[id] = l;
        s->pen_bits[(size_t)id >> 6] |= 1ull << (id & 63);
    }
    *marked = true;
    return LT_OK;
}

static void unmark_penalties(struct lt_sampler *s, const lt_token *history, size_t n_history)
{
    for (size_t i = 0; i < n_history; i++)
        if (history[i] >= 0 && (size_t)history[i] < s->cap)
            s->pen_bits[(size_t)history[i] >> 6] = 0;
}

/* Logit i as the filters see it: penalised when the window marked it, divided by temp
 * unless temp is 1 (the greedy pick passes 1). false (lt_fail) for a NaN. */
static inline bool logit_at(const struct lt_sampler *s, const float *logits, size_t i, bool marked,
                            float temp, float *v)
{
    float x = logits[i];
    if (x != x) {
        lt_fail(LT_ERR_INVALID, "sampler: logit %zu is NaN", i);
        return false;
    }
    if (marked && pen_bit(s->pen_bits, i))
        x = s->adj[i];
    *v = temp != 1.0f ? x / temp : x;
    return true;
}

/* The largest logit with no penalty marked, the lowest id among equals: one pass for the
 * maximum and whether any is NaN (SSE2, 16 floats a step, where the compiler targets it:
 * the serving loop picks one per slot and step over ~250k logits), then the first id that
 * holds it. The same id and the same error as pick_greedy's loop: equal values (+0 and -0
 * too) go to the lowest id, and a NaN anywhere is refused. */
static lt_status pick_greedy_plain(const float *logits, size_t n_vocab, lt_token *out)
{
    float best = -INFINITY;
    bool any_nan = false;
    size_t i = 0;
#if defined(__SSE2__)
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0, bad = _mm_setzero_ps();
    for (; i + 16 <= n_vocab; i += 16) {
        const __m128 x0 = _mm_loadu_ps(logits + i), x1 = _mm_loadu_ps(logits + i + 4),
                     x2 = _mm_loadu_ps(logits + i + 8), x3 = _mm_loadu_ps(logits + i + 12);
        bad =
            _mm_or_ps(bad, _mm_or_ps(_mm_or_ps(_mm_cmpunord_ps(x0, x0), _mm_cmpunord_ps(x1, x1)),
                                     _mm_or_ps(_mm_cmpunord_ps(x2, x2), _mm_cmpunord_ps(x3, x3))));
        m0 = _mm_max_ps(m0, x0);
        m1 = _mm_max_ps(m1, x1);
        m2 = _mm_max_ps(m2, x2);
        m3 = _mm_max_ps(m3, x3);
    }
    float lanes[4];
    _mm_storeu_ps(lanes, _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
    for (int j = 0; j < 4; j++)
        best = lanes[j] > best ? lanes[j] : best;
    any_nan = _mm_movemask_ps(bad) != 0;
#endif
    for (; i < n_vocab; i++) {
        const float x = logits[i];
        any_nan = any_nan || x != x;
        best = x > best ? x : best;
    }
    for (size_t k = 0; any_nan && k < n_vocab; k++)
        if (logits[k] != logits[k])
            return lt_fail(LT_ERR_INVALID, "sampler: logit %zu is NaN", k);
    size_t k = 0;
#if defined(__SSE2__)
    const __m128 b4 = _mm_set1_ps(best);
    for (; k + 16 <= n_vocab; k += 16) {
        const __m128 e0 = _mm_cmpeq_ps(_mm_loadu_ps(logits + k), b4),
                     e1 = _mm_cmpeq_ps(_mm_loadu_ps(logits + k + 4), b4),
                     e2 = _mm_cmpeq_ps(_mm_loadu_ps(logits + k + 8), b4),
                     e3 = _mm_cmpeq_ps(_mm_loadu_ps(logits + k + 12), b4);
        if (_mm_movemask_ps(_mm_or_ps(_mm_or_ps(e0, e1), _mm_or_ps(e2, e3))))
            break; /* the first equal one is among these 16: the loop below finds it */
    }
#endif
    for (; k < n_vocab; k++)
        if (logits[k] == best)
            break;
    *out = k < n_vocab ? (lt_token)k : 0;
    return LT_OK;
}

/* The largest (penalised) logit, the lowest id among equals. */
static lt_status pick_greedy(const struct lt_sampler *s, const float *logits, size_t n_vocab,
                             bool marked, lt_token *out)
{
    if (!marked)
        return pick_greedy_plain(logits, n_vocab, out);
    size_t best = 0;
    float bv = -INFINITY;
    bool any = false;
    for (size_t i = 0; i < n_vocab; i++) {
        float v;
        if (!logit_at(s, logits, i, marked, 1.0f, &v))
            return LT_ERR_INVALID;
        if (!any || v > bv) {
            best = i;
            bv = v;
            any = true;
        }
    }
    *out = (lt_token)best;
    return LT_OK;
}

/* heap of k candidates whose root is the last of them in cand_before order */
static void heap_down(struct lt_sampler_cand *h, size_t k, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && cand_before(&h[w], &h[l]))
            w = l;
        if (r < k && cand_before(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        swap_cand(&h[i], &h[w]);
        i = w;
    }
}

/* The k first candidates (penalised, divided by the temperature) into s->cands[0..k), in
 * cand_before order. */
static lt_status top_k_pass(struct lt_sampler *s, const float *logits, size_t n_vocab, bool marked,
                            size_t k)
{
    struct lt_sampler_cand *h = s->cands;
    const float temp = s->params.temperature;
    size_t n = 0;
    for (size_t i = 0; i < n_vocab; i++) {
        float v;
        if (!logit_at(s, logits, i, marked, temp, &v))
            return LT_ERR_INVALID;
        const struct lt_sampler_cand c = {.logit = v, .id = (lt_token)i};
        if (n < k) {
            h[n++] = c;
            if (n == k)
                for (size_t j = k / 2; j-- > 0;)
                    heap_down(h, k, j);
        } else if (cand_before(&c, &h[0])) {
            h[0] = c;
            heap_down(h, k, 0);
        }
    }
    qsort(h, n, sizeof(*h), cand_cmp);
    return LT_OK;
}

/* Temperature alone (no top-k, top-p or min-p: the API's defaults): a draw from the whole
 * vocabulary without candidates. s->adj[i] becomes logit i (penalised, divided by the
 * temperature) in the pass that reads the penalised ones, then its exp. */
static lt_status draw_whole(struct lt_sampler *s, const float *logits, size_t n_vocab,
                            bool marked, lt_token *out)
{
    const float temp = s->params.temperature;
    float *e = s->adj, m = -INFINITY;
    for (size_t i = 0; i < n_vocab; i++) {
        float v; /* reads e[i] (s->adj) before it is overwritten */
        if (!logit_at(s, logits, i, marked, temp, &v))
            return LT_ERR_INVALID;
        e[i] = v;
        m = v > m ? v : m;
    }
    double z = 0;
    for (size_t i = 0; i < n_vocab; i++) {
        e[i] = expf(e[i] - m);
        z += e[i];
    }
    double u = lt_rng_uniform(&s->rng) * z, cum = 0;
    for (size_t i = 0; i < n_vocab; i++) {
        cum += e[i];
        if (u < cum) {
            *out = (lt_token)i;
            return LT_OK;
        }
    }
    *out = (lt_token)(n_vocab - 1); /* rounding left u at the very top */
    return LT_OK;
}

lt_status lt_sampler_sample(struct lt_sampler *s, const float *logits, size_t n_vocab,
                            const lt_token *history, size_t n_history, lt_token *out)
{
    const struct lt_sampler_params *p = &s->params;
    if (n_vocab == 0 || n_vocab > INT32_MAX)
        return lt_fail(LT_ERR_INVALID, "sampler: %zu logits", n_vocab);
    lt_status st = reserve(s, n_vocab);
    bool marked = false;
    if (st == LT_OK)
        st = mark_penalties(s, logits, n_vocab, history, n_history, &marked);
    if (st != LT_OK)
        return st;
    struct lt_sampler_cand *c = s->cands;
    size_t n = n_vocab;
    if (p->temperature <= 0) {
        st = pick_greedy(s, logits, n_vocab, marked, out);
        goto out;
    }
    const bool top_k = p->top_k > 0 && (size_t)p->top_k < n_vocab;
    if (!top_k && p->top_p >= 1.0f && p->min_p <= 0.0f) {
        st = draw_whole(s, logits, n_vocab, marked, out);
        goto out;
    }
    if (top_k) {
        n = (size_t)p->top_k;
        st = top_k_pass(s, logits, n_vocab, marked, n);
    } else {
        for (size_t i = 0; i < n_vocab && st == LT_OK; i++) {
            float v = 0;
            st = logit_at(s, logits, i, marked, p->temperature, &v) ? LT_OK : LT_ERR_INVALID;
            c[i] = (struct lt_sampler_cand){.logit = v, .id = (lt_token)i};
        }
    }
    if (st != LT_OK)
        goto out;
    if (p->top_p < 1.0f)
        n = apply_top_p(c, n, p->top_p);
    if (p->min_p > 0.0f)
        n = apply_min_p(c, n, p->min_p);
    *out = draw(c, n, &s->rng, s->adj); /* the penalised logits are read by now */
out:
    if (marked)
        unmark_penalties(s, history, n_history);
    return st;
}

/* ---- stop strings ---- */

struct lt_stop_result lt_stop_scan(const char *text, size_t len, size_t from,
                                   const char *const *stops, size_t n_stops)
{
    struct lt_stop_result r = {.safe_len = len};
    if (from > len)
        from = len;
    for (size_t p = from; p < len && !r.stopped; p++)
        for (size_t k = 0; k < n_stops; k++) {
            size_t sl = strlen(stops[k]);
            if (sl && sl <= len - p && !memcmp(text + p, stops[k], sl)) {
                r.stopped = true;
                r.stop_at = r.safe_len = p;
                r.which = k;
                break;
            }
        }
    if (r.stopped)
        return r;
    /* the longest tail text[p..len) (p >= from) that is a proper prefix of a stop string */
    size_t longest = 0;
    for (size_t k = 0; k < n_stops; k++)
        if (strlen(stops[k]) > longest)
            longest = strlen(stops[k]);
    size_t p0 = len - from >= longest ? len - (longest ? longest - 1 : 0) : from;
    for (size_t p = p0; p < len; p++) {
        bool prefix = false;
        for (size_t k = 0; k < n_stops && !prefix; k++) {
            size_t sl = strlen(stops[k]);
            prefix = len - p < sl && !memcmp(text + p, stops[k], len - p);
        }
        if (prefix) {
            r.safe_len = p;
            break;
        }
    }
    return r;
}
