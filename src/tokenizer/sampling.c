/* sampling.c: the sampler (penalty, temperature, top-k, top-p, min-p, draw), its PRNG, and
 * stop-string scanning.
 *
 * Candidates live in one scratch array; each filter shrinks the live prefix cands[0..n).
 * Sorting a 250k vocabulary for every token would dominate decoding, so top-k uses a
 * selection and top-p sorts only the tokens within a logit distance of the maximum that
 * already hold at least top_p of the probability mass (widening the distance until they
 * do): the tokens top-p keeps are always among those, so the result is the same as a full
 * sort's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/sampling.h"

/* ---- PRNG: xoshiro256** seeded by splitmix64 ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void lt_rng_seed(struct lt_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t lt_rng_next(struct lt_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double lt_rng_uniform(struct lt_rng *r)
{
    return (double)(lt_rng_next(r) >> 11) * 0x1.0p-53;
}

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

/* Moves the k first (in cand_before order) of c[0..n) to c[0..k), in no particular order. */
static void select_top(struct lt_sampler_cand *c, size_t n, size_t k)
{
    /* pivots from a PRNG of their own (not the sampler's, whose draws must not depend on
     * how much work the selection did), so no input is quadratic */
    struct lt_rng pivots;
    lt_rng_seed(&pivots, n * 31 + k);
    size_t lo = 0, hi = n; /* the k-th lies in [lo, hi) */
    while (hi - lo > 1) {
        size_t pi = lo + (size_t)(lt_rng_next(&pivots) % (hi - lo));
        swap_cand(&c[pi], &c[hi - 1]);
        struct lt_sampler_cand pivot = c[hi - 1];
        size_t store = lo;
        for (size_t i = lo; i + 1 < hi; i++)
            if (cand_before(&c[i], &pivot))
                swap_cand(&c[i], &c[store++]);
        swap_cand(&c[store], &c[hi - 1]);
        if (store == k || store + 1 == k)
            return;
        if (store > k)
            hi = store;
        else
            lo = store + 1;
    }
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
        z += exp((double)c[i].logit - m);
    double target = (double)top_p * z;
    size_t k = n;
    for (double d = 8; d < 1e30; d *= 2) {
        size_t j = 0;
        double mass = 0;
        for (size_t i = 0; i < n; i++)
            if ((double)c[i].logit >= m - d) {
                mass += exp((double)c[i].logit - m);
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
        cum += exp((double)c[i].logit - m);
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

static lt_token draw(struct lt_sampler_cand *c, size_t n, struct lt_rng *rng)
{
    float m = max_logit(c, n);
    double z = 0;
    for (size_t i = 0; i < n; i++)
        z += exp((double)c[i].logit - m);
    double u = lt_rng_uniform(rng) * z, cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += exp((double)c[i].logit - m);
        if (u < cum)
            return c[i].id;
    }
    return c[n - 1].id; /* rounding left u at the very top */
}

lt_status lt_sampler_sample(struct lt_sampler *s, const float *logits, size_t n_vocab,
                            const lt_token *history, size_t n_history, lt_token *out)
{
    const struct lt_sampler_params *p = &s->params;
    if (n_vocab == 0 || n_vocab > INT32_MAX)
        return lt_fail(LT_ERR_INVALID, "sampler: %zu logits", n_vocab);
    if (n_vocab > s->cap) {
        struct lt_sampler_cand *c = realloc(s->cands, n_vocab * sizeof(*c));
        if (!c)
            return lt_fail(LT_ERR_NOMEM, "sampler: out of memory for %zu candidates", n_vocab);
        s->cands = c;
        uint32_t *seen = realloc(s->seen, n_vocab * sizeof(*seen));
        if (!seen)
            return lt_fail(LT_ERR_NOMEM, "sampler: out of memory for %zu candidates", n_vocab);
        s->seen = seen;
        memset(s->seen, 0, n_vocab * sizeof(*seen));
        s->cap = n_vocab;
    }
    struct lt_sampler_cand *c = s->cands;
    for (size_t i = 0; i < n_vocab; i++) {
        if (isnan(logits[i]))
            return lt_fail(LT_ERR_INVALID, "sampler: logit %zu is NaN", i);
        c[i] = (struct lt_sampler_cand){.logit = logits[i], .id = (lt_token)i};
    }

    const bool repeat = p->repeat_penalty != 1.0f,
               counted = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if ((repeat || counted) && n_history) {
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
        /* each token once, at its first place in the window; its count goes back to 0,
         * which leaves the scratch clean */
        for (size_t i = from; i < n_history; i++) {
            const lt_token id = history[i];
            const uint32_t k = s->seen[id];
            if (!k)
                continue;
            s->seen[id] = 0;
            float l = c[id].logit;
            if (repeat)
                l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
            if (counted)
                l -= (float)k * p->frequency_penalty + p->presence_penalty;
            c[id].logit = l;
        }
    }

    if (p->temperature <= 0) {
        size_t best = 0;
        for (size_t i = 1; i < n_vocab; i++)
            if (c[i].logit > c[best].logit)
                best = i;
        *out = c[best].id;
        return LT_OK;
    }
    size_t n = n_vocab;
    if (p->temperature != 1.0f)
        for (size_t i = 0; i < n; i++)
            c[i].logit /= p->temperature;
    if (p->top_k > 0 && (size_t)p->top_k < n) {
        select_top(c, n, (size_t)p->top_k);
        n = (size_t)p->top_k;
    }
    if (p->top_p < 1.0f)
        n = apply_top_p(c, n, p->top_p);
    if (p->min_p > 0.0f)
        n = apply_min_p(c, n, p->min_p);
    *out = draw(c, n, &s->rng);
    return LT_OK;
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
