/* test_tokenizer_sampling.c: the sampler against reference computations written here
 * (argmax, softmax frequencies, the top-k / top-p / min-p sets by full sort), determinism
 * of the seeded PRNG, and stop-string scanning against a brute-force search. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lathe/sampling.h"

/* xoshiro256** as its authors publish it, seeded by splitmix64: the reference stream */
static uint64_t ref_state[4];
static uint64_t ref_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}
static void ref_seed(uint64_t seed)
{
    for (int i = 0; i < 4; i++) {
        seed += 0x9e3779b97f4a7c15ull;
        uint64_t z = seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        ref_state[i] = z ^ (z >> 31);
    }
}
static uint64_t ref_next(void)
{
    uint64_t *s = ref_state, r = ref_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = ref_rotl(s[3], 45);
    return r;
}

static void test_rng(void)
{
    struct lt_rng r;
    lt_rng_seed(&r, 42);
    ref_seed(42);
    int same = 0;
    for (int i = 0; i < 1000; i++)
        same += lt_rng_next(&r) == ref_next();
    CHECK(same == 1000);
    double lo = 1, hi = 0, sum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = lt_rng_uniform(&r);
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
        sum += u;
    }
    CHECK(lo >= 0 && hi < 1 && fabs(sum / 100000 - 0.5) < 0.01, "mean %g", sum / 100000);
}

static struct lt_sampler make(struct lt_sampler_params p)
{
    struct lt_sampler s;
    CHECK(lt_sampler_init(&s, &p) == LT_OK, "%s", lt_last_error());
    return s;
}

static void fill_logits(float *l, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        l[i] = (float)((seed >> 8) % 10000) / 1000.0f - 5.0f;
    }
}

static void test_greedy(void)
{
    float l[1000];
    fill_logits(l, 1000, 1);
    size_t best = 0;
    for (size_t i = 1; i < 1000; i++)
        if (l[i] > l[best])
            best = i;
    struct lt_sampler_params p = lt_sampler_default_params();
    p.temperature = 0;
    struct lt_sampler s = make(p);
    lt_token out = -1;
    CHECK(lt_sampler_sample(&s, l, 1000, NULL, 0, &out) == LT_OK && out == (lt_token)best);
    /* the penalty pushes the best token down when it was seen */
    lt_token hist[] = {(lt_token)best};
    s.params.repeat_penalty = 100.0f;
    CHECK(lt_sampler_sample(&s, l, 1000, hist, 1, &out) == LT_OK && out != (lt_token)best);
    /* ... but not when it is outside the window */
    lt_token hist2[] = {(lt_token)best, 1, 2};
    s.params.repeat_last_n = 2;
    CHECK(lt_sampler_sample(&s, l, 1000, hist2, 3, &out) == LT_OK && out == (lt_token)best);
    /* ties: the lower id */
    float tie[4] = {1, 3, 3, 2};
    CHECK(lt_sampler_sample(&s, tie, 4, NULL, 0, &out) == LT_OK && out == 1);
    /* a negative logit is multiplied by the penalty, a positive one divided */
    float pn[3] = {-1.0f, -1.5f, 0.5f};
    lt_token h3[] = {0, 2};
    s.params.repeat_penalty = 2.0f;
    s.params.repeat_last_n = -1;
    CHECK(lt_sampler_sample(&s, pn, 3, h3, 2, &out) == LT_OK && out == 2); /* 0.25 > -1.5 > -2 */
    pn[2] = -0.2f; /* -> -0.4, below -1.5? no: -0.4 > -1.5, still 2 */
    CHECK(lt_sampler_sample(&s, pn, 3, h3, 2, &out) == LT_OK && out == 2);
    pn[2] = -1.0f; /* -> -2.0 < -1.5: token 1 wins */
    CHECK(lt_sampler_sample(&s, pn, 3, h3, 2, &out) == LT_OK && out == 1);
    lt_token badh[] = {5};
    CHECK(lt_sampler_sample(&s, pn, 3, badh, 1, &out) == LT_ERR_INVALID);
    float nan_l[2] = {0, NAN};
    CHECK(lt_sampler_sample(&s, nan_l, 2, NULL, 0, &out) == LT_ERR_INVALID);
    lt_sampler_free(&s);

    /* presence and frequency: a token seen k times loses k * frequency + presence */
    p = lt_sampler_default_params();
    p.temperature = 0;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 1.0f;
    s = make(p);
    float pf[5] = {0, 5, 2, 6, 4.4f};
    lt_token hf[] = {1, 1, 3};
    /* 1: 5 - 2.5 = 2.5; 3: 6 - 1.5 = 4.5, over 4: 4.4 */
    CHECK(lt_sampler_sample(&s, pf, 5, hf, 3, &out) == LT_OK && out == 3, "got %d", out);
    s.params.frequency_penalty = 2.0f; /* 3: 6 - 2.5 = 3.5 < 4.4 */
    CHECK(lt_sampler_sample(&s, pf, 5, hf, 3, &out) == LT_OK && out == 4, "got %d", out);
    s.params.repeat_last_n = 1; /* only the last 3 counts: 1 keeps its 5, the best */
    CHECK(lt_sampler_sample(&s, pf, 5, hf, 3, &out) == LT_OK && out == 1, "got %d", out);
    s.params.repeat_last_n = -1;
    s.params.frequency_penalty = -3.0f; /* negative: a reward; 1: 5 + 6 - 0.5 */
    CHECK(lt_sampler_sample(&s, pf, 5, hf, 3, &out) == LT_OK && out == 1, "got %d", out);
    lt_sampler_free(&s);
    p.presence_penalty = NAN;
    struct lt_sampler bad;
    CHECK(lt_sampler_init(&bad, &p) == LT_ERR_INVALID);
}

/* The unpenalised greedy pick (its own 8-lane pass) against a plain scan: lengths around the
 * lane count, few distinct values (ties), -inf, -0 beside +0, and a NaN anywhere (before or
 * after the maximum) refused. */
static void test_greedy_lanes(void)
{
    struct lt_sampler_params p = lt_sampler_default_params();
    p.temperature = 0;
    struct lt_sampler s = make(p);
    uint64_t r = 12345;
    float l[300];
    int wrong = 0, nan_wrong = 0, runs = 0;
    for (int t = 0; t < 2000; t++) {
        const size_t n = 1 + (size_t)(t % 37) + (t % 5 == 0 ? 250 : 0);
        for (size_t i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            const int v = (int)(r >> 59); /* 0..31: many ties */
            l[i] = v == 0 ? -INFINITY : v == 1 ? -0.0f : v == 2 ? 0.0f : (float)(v % 7) - 3.0f;
        }
        const bool with_nan = t % 3 == 0;
        if (with_nan)
            l[(size_t)(r >> 33) % n] = NAN;
        size_t best = 0;
        for (size_t i = 1; i < n; i++)
            if (l[i] > l[best])
                best = i;
        lt_token out = -1;
        const lt_status st = lt_sampler_sample(&s, l, n, NULL, 0, &out);
        runs++;
        if (with_nan)
            nan_wrong += st != LT_ERR_INVALID;
        else
            wrong += st != LT_OK || out != (lt_token)best;
    }
    CHECK(wrong == 0 && nan_wrong == 0,
          "greedy over %d arrays: %d picks differ from a plain scan, %d NaN arrays not refused",
          runs, wrong, nan_wrong);
    lt_sampler_free(&s);
}

/* Draws `n` samples and compares frequencies with the reference probabilities `ref` (zero
 * outside the allowed set): every draw must be allowed and each frequency within 5 sigma. */
static void check_distribution(struct lt_sampler *s, const float *logits, size_t v,
                               const double *ref, int n, const char *what)
{
    int *count = calloc(v, sizeof(int));
    int outside = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        lt_token t = -1;
        failed += lt_sampler_sample(s, logits, v, NULL, 0, &t) != LT_OK;
        if (t < 0 || (size_t)t >= v || ref[t] == 0)
            outside++;
        else
            count[t]++;
    }
    CHECK(failed == 0 && outside == 0, "%s: %d draws outside the allowed set", what, outside);
    int off = 0;
    for (size_t i = 0; i < v; i++) {
        double e = ref[i] * n, sd = sqrt(n * ref[i] * (1 - ref[i])) + 1;
        off += fabs(count[i] - e) > 5 * sd;
    }
    CHECK(off == 0, "%s: %d tokens drawn at the wrong rate", what, off);
    free(count);
}

/* the reference filters, on logits already divided by the temperature: a full sort,
 * descending by logit, ascending by id */
static const float *sort_logits;
static int cmp_idx(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    if (sort_logits[i] != sort_logits[j])
        return sort_logits[i] > sort_logits[j] ? -1 : 1;
    return i - j;
}

static void ref_probs(const float *logits, size_t v, float temp, int top_k, float top_p,
                      float min_p, double *out)
{
    float *l = malloc(v * sizeof(float));
    int *idx = malloc(v * sizeof(int));
    for (size_t i = 0; i < v; i++) {
        l[i] = logits[i] / temp;
        idx[i] = (int)i;
    }
    sort_logits = l;
    qsort(idx, v, sizeof(int), cmp_idx);
    size_t keep = top_k > 0 && (size_t)top_k < v ? (size_t)top_k : v;
    double z = 0;
    for (size_t i = 0; i < keep; i++)
        z += exp((double)l[idx[i]] - l[idx[0]]);
    if (top_p < 1) {
        double cum = 0;
        for (size_t i = 0; i < keep; i++) {
            cum += exp((double)l[idx[i]] - l[idx[0]]) / z;
            if (cum >= top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    size_t kept = 0;
    for (size_t i = 0; i < keep; i++) /* min-p: p_i / p_max >= min_p */
        if (min_p <= 0 || exp((double)l[idx[i]] - l[idx[0]]) >= min_p)
            idx[kept++] = idx[i];
    memset(out, 0, v * sizeof(double));
    z = 0;
    for (size_t i = 0; i < kept; i++)
        z += exp((double)l[idx[i]] - l[idx[0]]);
    for (size_t i = 0; i < kept; i++)
        out[idx[i]] = exp((double)l[idx[i]] - l[idx[0]]) / z;
    free(l);
    free(idx);
}

static void test_filters(void)
{
    enum { V = 64 };
    float l[V];
    fill_logits(l, V, 3);
    for (size_t i = 0; i < V; i++)
        l[i] *= 0.6f;
    double ref[V];
    struct {
        float temp;
        int top_k;
        float top_p, min_p;
        const char *what;
    } cases[] = {
        {1.0f, 0, 1.0f, 0.0f, "plain softmax"}, {0.7f, 0, 1.0f, 0.0f, "temperature 0.7"},
        {1.5f, 10, 1.0f, 0.0f, "top-k 10"},     {1.0f, 0, 0.6f, 0.0f, "top-p 0.6"},
        {1.0f, 0, 1.0f, 0.3f, "min-p 0.3"},     {0.8f, 20, 0.9f, 0.05f, "all four"},
        {1.0f, 1, 1.0f, 0.0f, "top-k 1"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct lt_sampler_params p = lt_sampler_default_params();
        p.temperature = cases[c].temp;
        p.top_k = cases[c].top_k;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.seed = 1000 + c;
        struct lt_sampler s = make(p);
        ref_probs(l, V, p.temperature, p.top_k, p.top_p, p.min_p, ref);
        check_distribution(&s, l, V, ref, 20000, cases[c].what);
        lt_sampler_free(&s);
    }

    /* top-p over a large vocabulary where the first logit window does not hold enough mass
     * (5 tokens at 10 hold 0.92, 20000 tied tokens at 0 the rest; ties go by id) */
    enum { BIG = 20005 };
    float *big = malloc(BIG * sizeof(float));
    double *bref = malloc(BIG * sizeof(double));
    for (size_t i = 0; i < BIG; i++)
        big[i] = i % 4001 == 7 ? 10.0f : 0.0f;
    struct lt_sampler_params p = lt_sampler_default_params();
    p.top_p = 0.95f;
    p.seed = 5;
    struct lt_sampler s = make(p);
    ref_probs(big, BIG, 1.0f, 0, 0.95f, 0.0f, bref);
    size_t allowed = 0;
    for (size_t i = 0; i < BIG; i++)
        allowed += bref[i] > 0;
    CHECK(allowed > 5 && allowed < 20000, "%zu tokens allowed", allowed);
    check_distribution(&s, big, BIG, bref, 1500, "top-p 0.95 over 20005 tokens");
    lt_sampler_free(&s);
    free(big);
    free(bref);
}

static void test_determinism(void)
{
    float l[500];
    fill_logits(l, 500, 9);
    struct lt_sampler_params p = lt_sampler_default_params();
    p.temperature = 0.9f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.seed = 1234;
    lt_token a[200], b[200], c[200];
    struct lt_sampler s1 = make(p), s2 = make(p);
    p.seed = 1235;
    struct lt_sampler s3 = make(p);
    int failed = 0;
    for (int i = 0; i < 200; i++) {
        failed += lt_sampler_sample(&s1, l, 500, a, (size_t)i, &a[i]) != LT_OK;
        failed += lt_sampler_sample(&s2, l, 500, b, (size_t)i, &b[i]) != LT_OK;
        failed += lt_sampler_sample(&s3, l, 500, c, (size_t)i, &c[i]) != LT_OK;
    }
    CHECK(failed == 0);
    CHECK(!memcmp(a, b, sizeof(a)), "the same seed gives the same tokens");
    CHECK(memcmp(a, c, sizeof(a)) != 0, "another seed gives other tokens");
    lt_sampler_free(&s1);
    lt_sampler_free(&s2);
    lt_sampler_free(&s3);

    struct lt_sampler s;
    struct lt_sampler_params bad = lt_sampler_default_params();
    bad.top_p = 0;
    CHECK(lt_sampler_init(&s, &bad) == LT_ERR_INVALID);
    bad = lt_sampler_default_params();
    bad.min_p = -1;
    CHECK(lt_sampler_init(&s, &bad) == LT_ERR_INVALID);
    bad = lt_sampler_default_params();
    bad.temperature = NAN;
    CHECK(lt_sampler_init(&s, &bad) == LT_ERR_INVALID);
}

/* ---- stop strings ---- */

static struct lt_stop_result ref_stop(const char *text, size_t len, const char *const *stops,
                                      size_t n)
{
    struct lt_stop_result r = {.safe_len = len};
    for (size_t p = 0; p < len && !r.stopped; p++)
        for (size_t k = 0; k < n; k++) {
            size_t sl = strlen(stops[k]);
            if (sl && p + sl <= len && !strncmp(text + p, stops[k], sl)) {
                r.stopped = true;
                r.stop_at = r.safe_len = p;
                r.which = k;
                break;
            }
        }
    if (r.stopped)
        return r;
    for (size_t p = 0; p < len; p++) /* the earliest start of a tail that could grow into one */
        for (size_t k = 0; k < n; k++)
            if (strlen(stops[k]) > len - p && !strncmp(stops[k], text + p, len - p))
                return (struct lt_stop_result){.safe_len = p};
    return r;
}

static void test_stop(void)
{
    const char *stops[] = {"</s>", "User:", "ab", "abcab"};
    /* streaming: text arrives in pieces; what is shown never includes a stop string and
     * never needs to be taken back */
    struct lt_stop_result r = lt_stop_scan("hello </", 8, 0, stops, 4);
    CHECK(!r.stopped && r.safe_len == 6);
    r = lt_stop_scan("hello </s> more", 15, r.safe_len, stops, 4);
    CHECK(r.stopped && r.stop_at == 6 && r.which == 0 && r.safe_len == 6);
    r = lt_stop_scan("Us", 2, 0, stops, 4);
    CHECK(!r.stopped && r.safe_len == 0);
    r = lt_stop_scan("x", 1, 0, stops, 0);
    CHECK(!r.stopped && r.safe_len == 1);

    unsigned rng = 5;
    int bad = 0, stopped = 0;
    for (int trial = 0; trial < 5000; trial++) {
        char text[40];
        size_t len = 0, safe = 0;
        struct lt_stop_result got = {0};
        while (len < 30 && !got.stopped) {
            rng = rng * 1103515245u + 12345u;
            size_t piece = 1 + (rng >> 16) % 4;
            for (size_t i = 0; i < piece && len < 39; i++) {
                rng = rng * 1103515245u + 12345u;
                text[len++] = "abcUser:</s> "[(rng >> 16) % 13];
            }
            text[len] = 0;
            got = lt_stop_scan(text, len, safe, stops, 4);
            struct lt_stop_result want = ref_stop(text, len, stops, 4);
            bad += got.stopped != want.stopped || got.safe_len != want.safe_len ||
                   (want.stopped && (got.stop_at != want.stop_at || got.which != want.which));
            bad += got.safe_len < safe; /* shown text is never taken back */
            safe = got.safe_len;
        }
        stopped += got.stopped;
    }
    CHECK(bad == 0, "%d scans differ from the brute-force reference", bad);
    CHECK(stopped > 500, "only %d of 5000 streams met a stop string", stopped);
}

int main(void)
{
    test_rng();
    test_greedy();
    test_greedy_lanes();
    test_filters();
    test_determinism();
    test_stop();
    return check_summary();
}
