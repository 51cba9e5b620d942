/* plot.c: the loss curve of a job as an SVG image: the training loss per optimizer step as
 * a line, the evaluation loss at each epoch's end as dots, with labelled axes.
 *
 * Written straight to the path (it is a side product, not the job's output); a failed write
 * removes the partial file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/train.h"

#define PLOT_W 720
#define PLOT_H 400
#define PLOT_L 70 /* margins */
#define PLOT_R 20
#define PLOT_T 40
#define PLOT_B 50

lt_status lt_train_plot_svg(const struct lt_train_result *r, const char *path)
{
    int n = r->n_curve;
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(r->curve[i])) {
            lo = fminf(lo, r->curve[i]);
            hi = fmaxf(hi, r->curve[i]);
        }
    for (int e = 0; e < r->n_epochs; e++)
        if (isfinite(r->eval_loss[e])) {
            lo = fminf(lo, r->eval_loss[e]);
            hi = fmaxf(hi, r->eval_loss[e]);
        }
    if (!(lo <= hi))
        return lt_fail(LT_ERR_INVALID, "no loss values to plot");
    lo = lo > 0 ? 0 : lo; /* losses are >= 0: start the axis at 0 */
    if (hi - lo < 1e-6f)
        hi = lo + 1;
    FILE *f = fopen(path, "w");
    if (!f)
        return lt_fail(LT_ERR_IO, "%s: %s", path, strerror(errno));
    const double pw = PLOT_W - PLOT_L - PLOT_R, ph = PLOT_H - PLOT_T - PLOT_B;
    int xmax = n > 1 ? n : 2;
#define X(step) (PLOT_L + pw * ((double)(step)-1) / (xmax - 1))
#define Y(v) (PLOT_T + ph * (1.0 - ((double)(v)-lo) / (hi - lo)))
    fprintf(
        f,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
        "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
        "<text x=\"%d\" y=\"24\" font-size=\"15\">loss per step (%d steps, %d epoch%s)</text>\n",
        PLOT_W, PLOT_H, PLOT_W, PLOT_H, PLOT_L, n, r->n_epochs, r->n_epochs == 1 ? "" : "s");
    /* axes and grid: 5 horizontal lines */
    for (int k = 0; k <= 4; k++) {
        double v = lo + (hi - lo) * k / 4.0;
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                PLOT_L, Y(v), PLOT_W - PLOT_R, Y(v), PLOT_L - 6, Y(v) + 4, v);
    }
    fprintf(f,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
            "<text x=\"%d\" y=\"%d\" text-anchor=\"start\">1</text>\n"
            "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%d</text>\n"
            "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">optimizer step</text>\n",
            PLOT_L, PLOT_T, PLOT_L, PLOT_H - PLOT_B, PLOT_L, PLOT_H - PLOT_B, PLOT_W - PLOT_R,
            PLOT_H - PLOT_B, PLOT_L, PLOT_H - PLOT_B + 16, PLOT_W - PLOT_R, PLOT_H - PLOT_B + 16,
            xmax, PLOT_L + pw / 2, PLOT_H - 12);
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
    for (int i = 0; i < n; i++)
        if (isfinite(r->curve[i]))
            fprintf(f, "%.1f,%.1f ", X(i + 1), Y(r->curve[i]));
    fprintf(f, "\"/>\n");
    int per_epoch = r->n_epochs > 0 ? n / r->n_epochs : 0;
    bool any_eval = false;
    for (int e = 0; e < r->n_epochs; e++)
        if (isfinite(r->eval_loss[e])) {
            any_eval = true;
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#d62728\"/>\n",
                    X(per_epoch * (e + 1)), Y(r->eval_loss[e]));
        }
    fprintf(f, "<text x=\"%d\" y=\"24\" text-anchor=\"end\" fill=\"#1f77b4\">train</text>\n",
            PLOT_W - PLOT_R);
    if (any_eval)
        fprintf(f,
                "<text x=\"%d\" y=\"38\" text-anchor=\"end\" fill=\"#d62728\">eval (per "
                "epoch)</text>\n",
                PLOT_W - PLOT_R);
    fprintf(f, "</svg>\n");
#undef X
#undef Y
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        remove(path);
        return lt_fail(LT_ERR_IO, "%s: write failed", path);
    }
    return LT_OK;
}
