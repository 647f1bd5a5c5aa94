/* A deliberately misbehaving C transform, for the host's tests: each
 * record's value names what it tries, and the row it writes (target
 * `probe`: offset, what, n, text) says what it got.
 *
 * - `clock`: n = clock_gettime(CLOCK_REALTIME) in ms (must be the batch time)
 * - `sleep`: n = monotonic ns that pass over sleep(3600) (virtual, at once)
 * - `random`: n = 62 bits from getentropy
 * - `file`: tries to open /etc/passwd; n = 1 if it could, text = the error
 * - `env`: n = number of environment variables
 * - `print`: prints 20,000 lines
 * - `spin`, `bomb`, `recurse`, `abort`: loops forever, allocates without
 *   end, recurses without end, aborts
 * - anything else: echoed (n = its length)
 */
#include "sluice.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

bool sluice_init(const char *params, size_t len, char **error) {
  (void)params, (void)len, (void)error;
  return true;
}

static int64_t now_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static char *volatile hoard;

/* Deep enough that no optimiser turns it into a loop. */
static volatile int sink;
static int recurse(int n) {
  volatile char frame[256];
  frame[n & 255] = (char)n;
  sink = frame[(n * 7) & 255];
  return recurse(n + 1) + frame[0];
}

bool sluice_process(sluice_batch *batch, sluice_output *out, sluice_error *error) {
  (void)error;
  static const char *names[] = {"offset", "what", "n", "text"};
  static const sluice_kind kinds[] = {SLUICE_INT64, SLUICE_TEXT, SLUICE_INT64, SLUICE_TEXT};
  int t = sluice_target(out, "probe", names, kinds, 4);
  sluice_record r;
  while (sluice_next(batch, &r)) {
    char what[32] = {0};
    memcpy(what, r.value ? (const char *)r.value : "", r.value_len < 31 ? r.value_len : 31);
    int64_t n = 0;
    const char *text = "";
    if (!strcmp(what, "clock")) {
      n = now_ns(CLOCK_REALTIME) / 1000000;
    } else if (!strcmp(what, "sleep")) {
      int64_t before = now_ns(CLOCK_MONOTONIC);
      sleep(3600);
      n = now_ns(CLOCK_MONOTONIC) - before;
    } else if (!strcmp(what, "random")) {
      uint64_t v = 0;
      getentropy(&v, sizeof v);
      n = (int64_t)(v >> 2);
    } else if (!strcmp(what, "file")) {
      FILE *f = fopen("/etc/passwd", "r");
      n = f != NULL;
      text = f ? "opened" : strerror(errno);
      if (f) fclose(f);
    } else if (!strcmp(what, "env")) {
      for (char **e = environ; e && *e; e++) n++;
    } else if (!strcmp(what, "print")) {
      for (int i = 0; i < 20000; i++) printf("line %d of a flood\n", i);
      fflush(stdout);
    } else if (!strcmp(what, "spin")) {
      for (volatile int i = 0;; i++) {}
    } else if (!strcmp(what, "bomb")) {
      /* Touch a byte per page (memory, not fuel, runs out) and keep every
       * block reachable, so no optimiser may drop the allocations. */
      for (;;) {
        char *p = malloc(1 << 20);
        if (!p) abort();
        for (size_t i = 0; i < (1 << 20); i += 4096) p[i] = 1;
        *(char **)p = hoard;
        hoard = p;
      }
    } else if (!strcmp(what, "recurse")) {
      n = recurse(0);
    } else if (!strcmp(what, "abort")) {
      fprintf(stderr, "hostile plugin aborts on purpose\n");
      abort();
    } else {
      n = (int64_t)r.value_len;
    }
    sluice_row(out, t);
    sluice_int(out, r.offset);
    sluice_text(out, what, strlen(what));
    sluice_int(out, n);
    sluice_text(out, text, strlen(text));
  }
  return true;
}
