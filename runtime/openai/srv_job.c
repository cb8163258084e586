/* srv_job: one OpenAI request through the engine. The engine's callback (on the engine
 * thread; it must not block) appends each event to the job's per-choice state under the
 * job's lock and wakes the consumer: a connection thread that streams or waits, or a batch
 * worker. The job lives until both the consumer and the engine have let go of it, so a
 * client that disconnects can cancel and leave while the engine finishes its last event. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "openai.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void job_free(srv_job *j) {
  for (int i = 0; j->ch && i < j->p.n; i++) {
    free(j->ch[i].text);
    free(j->ch[i].toks);
  }
  free(j->ch);
  free(j->ptoks);
  srv_params_free(&j->p);
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j);
}

static void unref(srv_job *j) {
  pthread_mutex_lock(&j->mu);
  int left = --j->refs;
  pthread_mutex_unlock(&j->mu);
  if (left == 0) job_free(j);
}

/* Growth failures drop data rather than block the engine thread; they mark the job failed. */
static void add_text(srv_job *j, srv_choice *ch, const char *t, size_t n) {
  if (ch->len + n + 1 > ch->cap) {
    size_t cap = (ch->len + n + 1) * 2 + 64;
    char *p = realloc(ch->text, cap);
    if (!p) {
      j->failed = true;
      return;
    }
    ch->text = p, ch->cap = cap;
  }
  memcpy(ch->text + ch->len, t, n);
  ch->len += n;
  ch->text[ch->len] = '\0';
}

static void set_tok(srv_tok *t, const irt_event *ev) {
  t->id = ev->token;
  t->logprob = ev->logprob;
  t->n_top = ev->n_top;
  for (int k = 0; k < ev->n_top; k++)
    t->top_id[k] = ev->top_tokens[k], t->top_lp[k] = ev->top_logprobs[k];
}

static void add_tok(srv_job *j, srv_choice *ch, const irt_event *ev) {
  if (ch->n_toks == ch->cap_toks) {
    int64_t cap = ch->cap_toks ? ch->cap_toks * 2 : 16;
    srv_tok *p = realloc(ch->toks, (size_t)cap * sizeof *p);
    if (!p) {
      j->failed = true;
      return;
    }
    ch->toks = p, ch->cap_toks = cap;
  }
  set_tok(&ch->toks[ch->n_toks++], ev);
}

/* A finished request's times to the server's hook: TTFT, time per output token after the
 * first, latency. */
static void record(srv_job *j) {
  if (!j->c->on_done) return;
  int64_t most = 0;
  for (int i = 0; i < j->p.n; i++) most = j->ch[i].n_gen > most ? j->ch[i].n_gen : most;
  double ttft = most ? (j->t_first - j->t_submit) / 1e3 : -1;
  double tpot = most > 1 ? (j->t_done - j->t_first) / 1e3 / (double)(most - 1) : -1;
  j->c->on_done(j->c->on_done_cls, ttft, tpot, (j->t_done - j->t_submit) / 1e3, j->cancelled);
}

static void on_event(void *user, const irt_event *ev) {
  srv_job *j = user;
  double now = now_ms();
  pthread_mutex_lock(&j->mu);
  srv_choice *ch = &j->ch[ev->index];
  j->prompt_tokens = ev->prompt_tokens;
  j->cached_tokens = ev->cached_tokens;
  if (ev->prompt) { /* a scored prompt token (echo with logprobs) */
    if (j->ptoks && j->n_ptoks < j->p.n_prompt) set_tok(&j->ptoks[j->n_ptoks++], ev);
  } else if (ev->token >= 0 && j->p.echo_only) { /* the token run only to score the prompt */
    if (j->t_first == 0) j->t_first = now;
  } else if (ev->token >= 0) {
    if (j->t_first == 0) j->t_first = now;
    ch->n_gen++;
    ch->cum_lp += ev->logprob;
    /* the end-of-generation token itself is not part of the text, nor of its logprobs */
    bool eog = ev->finish == IRT_FINISH_STOP && !j->p.ignore_eos && j->c->tok &&
               irt_token_is_eog(j->c->tok, ev->token);
    if (j->p.logprobs >= 0 && !eog) add_tok(j, ch, ev);
  }
  if (ev->text_len && !j->p.echo_only) add_text(j, ch, ev->text, ev->text_len);
  if (ev->finish) ch->finish = j->p.echo_only ? IRT_FINISH_LENGTH : ev->finish;
  if (ev->finish == IRT_FINISH_CANCELLED && !j->cancelled) j->failed = true;
  j->events++;
  bool done = ev->request_done;
  if (done) j->done = true, j->t_done = now;
  pthread_cond_broadcast(&j->cv);
  if (j->wake) { /* an event-driven consumer parked on this job */
    void (*wake)(void *) = j->wake;
    j->wake = NULL;
    wake(j->wake_cls);
  }
  pthread_mutex_unlock(&j->mu);
  if (done) {
    record(j);
    unref(j); /* the engine's share */
  }
}

static srv_job *job_create(srv_ctx *c, srv_params *p) {
  srv_job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->ch = calloc((size_t)p->n, sizeof *j->ch);
  if (!j->ch) {
    free(j);
    return NULL;
  }
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  j->c = c;
  j->p = *p;
  memset(p, 0, sizeof *p);
  j->refs = 2;
  uint64_t x = c->id_salt ^ (atomic_fetch_add(&c->next_id, 1) * 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
  snprintf(j->id, sizeof j->id, "%s-%016llx", j->p.ep == SRV_CHAT ? "chatcmpl" : "cmpl",
           (unsigned long long)(x ^ (x >> 29)));
  j->created = (int64_t)time(NULL);
  return j;
}

srv_job *srv_job_submit(srv_ctx *c, srv_params *p, srv_error *err) {
  srv_job *j = job_create(c, p);
  if (!j) {
    srv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    return NULL;
  }
  const srv_params *q = &j->p;
  irt_request r = {.prompt_ids = q->prompt,
                   .n_prompt = (size_t)q->n_prompt,
                   .sampling = q->sampling,
                   .max_tokens = q->max_tokens,
                   .stop = (const char *const *)q->stop,
                   .n_stop = q->n_stop,
                   .include_stop_str = q->include_stop_str,
                   .ignore_eos = q->ignore_eos,
                   .n = q->n,
                   .priority = q->priority,
                   .tenant = q->tenant,
                   .on_event = on_event,
                   .user = j,
                   .presence_penalty = q->presence_penalty,
                   .frequency_penalty = q->frequency_penalty,
                   .repetition_penalty = q->repetition_penalty,
                   .min_tokens = q->min_tokens,
                   .stop_token_ids = q->stop_ids,
                   .n_stop_token_ids = q->n_stop_ids,
                   .top_logprobs = q->logprobs > 0 ? q->logprobs : 0,
                   .logit_bias_ids = q->bias_ids,
                   .logit_bias = q->bias,
                   .n_logit_bias = q->n_bias,
                   .grammar = q->grammar,
                   .prompt_logprobs = q->echo && q->logprobs >= 0};
  if (r.prompt_logprobs) { /* the first prompt token has no logprob */
    j->ptoks = calloc((size_t)q->n_prompt, sizeof *j->ptoks);
    if (!j->ptoks) {
      srv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
      goto refused;
    }
    j->ptoks[0] = (srv_tok){.id = q->prompt[0], .logprob = NAN};
    j->n_ptoks = 1;
  }
  irt_error e = {0};
  j->t_submit = now_ms();
  irt_status st = irt_engine_submit(c->e, &r, &j->rid, &e);
  if (st == IRT_OK) return j;
  if (st == IRT_BUSY)
    srv_fail(err, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
             "The server is at capacity (%s). Please retry after a short wait.", e.msg);
  else if (st == IRT_INVALID_ARG) srv_bad(err, NULL, "%s", e.msg);
  else srv_fail(err, 500, "server_error", NULL, NULL, "The engine refused the request: %s", e.msg);
refused:
  *p = j->p; /* back to the caller, e.g. for a retry */
  memset(&j->p, 0, sizeof j->p);
  j->p.n = p->n;
  job_free(j);
  return NULL;
}

bool srv_job_wait(srv_job *j, int timeout_ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&j->mu);
  while (!j->done && j->events == j->seen)
    if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) break;
  j->seen = j->events;
  bool done = j->done;
  pthread_mutex_unlock(&j->mu);
  return done;
}

bool srv_job_park(srv_job *j, void (*park)(void *), void (*wake)(void *), void *cls, bool *done) {
  pthread_mutex_lock(&j->mu);
  bool parked = !j->done && j->events == j->seen;
  if (parked) {
    j->wake = wake, j->wake_cls = cls;
    park(cls);
  } else {
    j->seen = j->events;
  }
  *done = j->done;
  pthread_mutex_unlock(&j->mu);
  return parked;
}

void srv_job_cancel(srv_job *j) {
  pthread_mutex_lock(&j->mu);
  bool first = !j->cancelled && !j->done;
  if (first) j->cancelled = true;
  pthread_mutex_unlock(&j->mu);
  if (first) irt_engine_cancel(j->c->e, j->rid);
}

void srv_job_release(srv_job *j) {
  if (j) unref(j);
}
