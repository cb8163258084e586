/* kn_nd_conv: convolution and pooling over 1 to 3 spatial dims (ir_op_nd_nn.c's conv and
 * pool), direct loops, parallel over (batch, output channel). Each output element sums its
 * window in a fixed order. */
#include <float.h>

#include "kn_nd.h"

/* A view's spatial extents padded to 3 dims (leading ones). */
static void spatial3(const kn_view *v, int64_t *s) {
  int k = v->rank - 2;
  for (int i = 0; i < 3; i++) s[i] = i < 3 - k ? 1 : v->shape[2 + i - (3 - k)];
}

/* Per-dim window parameters padded to 3 dims the same way. */
static void params3(int k, const int64_t *v, int64_t def, int64_t *out) {
  for (int i = 0; i < 3; i++) out[i] = i < 3 - k ? def : v[i - (3 - k)];
}

typedef struct conv_job {
  const kn_view *y, *x, *w, *b;
  int64_t xs[3], ys[3], ks[3], st[3], pb[3], dl[3], group;
} conv_job;

static void conv_rows(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const conv_job *j = arg;
  int64_t M = j->y->shape[1], C = j->x->shape[1], cg = C / j->group, mg = M / j->group;
  int64_t xplane = j->xs[0] * j->xs[1] * j->xs[2], yplane = j->ys[0] * j->ys[1] * j->ys[2];
  int64_t kvol = j->ks[0] * j->ks[1] * j->ks[2];
  const float *x = j->x->data, *w = j->w->data, *b = j->b ? j->b->data : NULL;
  float *y = j->y->data;
  for (int64_t nm = begin; nm < end; nm++) {
    int64_t n = nm / M, m = nm % M, c0 = (m / mg) * cg;
    float *yo = y + nm * yplane;
    for (int64_t od = 0; od < j->ys[0]; od++)
      for (int64_t oh = 0; oh < j->ys[1]; oh++)
        for (int64_t ow = 0; ow < j->ys[2]; ow++) {
          float acc = b ? b[m] : 0.0f;
          for (int64_t c = 0; c < cg; c++) {
            const float *xp = x + (n * C + c0 + c) * xplane, *wp = w + (m * cg + c) * kvol;
            for (int64_t kd = 0; kd < j->ks[0]; kd++) {
              int64_t id = od * j->st[0] - j->pb[0] + kd * j->dl[0];
              if (id < 0 || id >= j->xs[0]) continue;
              for (int64_t kh = 0; kh < j->ks[1]; kh++) {
                int64_t ih = oh * j->st[1] - j->pb[1] + kh * j->dl[1];
                if (ih < 0 || ih >= j->xs[1]) continue;
                for (int64_t kw = 0; kw < j->ks[2]; kw++) {
                  int64_t iw = ow * j->st[2] - j->pb[2] + kw * j->dl[2];
                  if (iw < 0 || iw >= j->xs[2]) continue;
                  acc += xp[(id * j->xs[1] + ih) * j->xs[2] + iw] *
                         wp[(kd * j->ks[1] + kh) * j->ks[2] + kw];
                }
              }
            }
          }
          yo[(od * j->ys[1] + oh) * j->ys[2] + ow] = acc;
        }
  }
}

void kn_nd_conv(kn_pool *p, const kn_view *y, const kn_view *x, const kn_view *w, const kn_view *b,
                const int64_t *strides, const int64_t *pads, const int64_t *dilations,
                int64_t group) {
  int k = x->rank - 2;
  conv_job j = {.y = y, .x = x, .w = w, .b = b, .group = group};
  int64_t one[3] = {1, 1, 1}, zero[6] = {0};
  spatial3(x, j.xs);
  spatial3(y, j.ys);
  spatial3(w, j.ks);
  params3(k, strides ? strides : one, 1, j.st);
  params3(k, pads ? pads : zero, 0, j.pb);
  params3(k, dilations ? dilations : one, 1, j.dl);
  kn_parallel_for(p, y->shape[0] * y->shape[1], 1, conv_rows, &j);
}

typedef struct pool_job {
  const kn_view *y, *x;
  int64_t xs[3], ys[3], ks[3], st[3], pb[3], pe[3], dl[3];
  bool avg, include_pad;
} pool_job;

static void pool_rows(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const pool_job *j = arg;
  int64_t xplane = j->xs[0] * j->xs[1] * j->xs[2], yplane = j->ys[0] * j->ys[1] * j->ys[2];
  const float *x = j->x->data;
  float *y = j->y->data;
  for (int64_t nc = begin; nc < end; nc++) {
    const float *xp = x + nc * xplane;
    for (int64_t od = 0; od < j->ys[0]; od++)
      for (int64_t oh = 0; oh < j->ys[1]; oh++)
        for (int64_t ow = 0; ow < j->ys[2]; ow++) {
          float acc = j->avg ? 0.0f : -FLT_MAX;
          int64_t cnt = 0, padded = 0;
          for (int64_t kd = 0; kd < j->ks[0]; kd++) {
            int64_t id = od * j->st[0] - j->pb[0] + kd * j->dl[0];
            for (int64_t kh = 0; kh < j->ks[1]; kh++) {
              int64_t ih = oh * j->st[1] - j->pb[1] + kh * j->dl[1];
              for (int64_t kw = 0; kw < j->ks[2]; kw++) {
                int64_t iw = ow * j->st[2] - j->pb[2] + kw * j->dl[2];
                /* taps in the pads count for count_include_pad; past them (ceil) never */
                bool in_pad = id >= -j->pb[0] && id < j->xs[0] + j->pe[0] && ih >= -j->pb[1] &&
                              ih < j->xs[1] + j->pe[1] && iw >= -j->pb[2] &&
                              iw < j->xs[2] + j->pe[2];
                if (id < 0 || id >= j->xs[0] || ih < 0 || ih >= j->xs[1] || iw < 0 ||
                    iw >= j->xs[2]) {
                  padded += in_pad;
                  continue;
                }
                float v = xp[(id * j->xs[1] + ih) * j->xs[2] + iw];
                if (j->avg) acc += v;
                else if (v > acc || v != v) acc = v;
                cnt++;
              }
            }
          }
          if (j->avg)
            acc = cnt + (j->include_pad ? padded : 0)
                      ? acc / (float)(cnt + (j->include_pad ? padded : 0))
                      : 0.0f;
          y[nc * yplane + (od * j->ys[1] + oh) * j->ys[2] + ow] = acc;
        }
  }
}

void kn_nd_pool(kn_pool *p, const kn_view *y, const kn_view *x, const int64_t *kernel,
                const int64_t *strides, const int64_t *pads, const int64_t *dilations, bool avg,
                bool count_include_pad) {
  int k = x->rank - 2;
  pool_job j = {.y = y, .x = x, .avg = avg, .include_pad = count_include_pad};
  int64_t one[3] = {1, 1, 1}, zero[6] = {0};
  spatial3(x, j.xs);
  spatial3(y, j.ys);
  params3(k, kernel, 1, j.ks);
  params3(k, strides ? strides : one, 1, j.st);
  params3(k, pads ? pads : zero, 0, j.pb);
  params3(k, pads ? pads + k : zero, 0, j.pe);
  params3(k, dilations ? dilations : one, 1, j.dl);
  kn_parallel_for(p, y->shape[0] * y->shape[1], 1, pool_rows, &j);
}
