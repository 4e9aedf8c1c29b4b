/* Links libchecks.so (a Gather of data[5] at idx[3], and an int32 Div of a[4] by b[4];
 * tests/runtime/test_run_checks.py builds it) and runs it with good and bad values: each
 * run prints its status, its error text and the quotients. */
#include <stdint.h>
#include <stdio.h>

#include "checks.h"

static void report(const char *what, int status, checks_session *s, const int32_t *q) {
    printf("%s: %d %s|%d %d %d %d\n", what, status, checks_error(s), q[0], q[1], q[2], q[3]);
}

int main(void) {
    checks_session *s = checks_open(2);
    if (!s) return 1;
    float data[5] = {0, 1, 2, 3, 4}, y[3];
    int64_t idx[3] = {1, -5, 4};
    int32_t a[4] = {INT32_MIN, 7, 8, 9}, b[4] = {-1, 2, -3, 4}, q[4];
    const void *in[] = {data, idx, a, b};
    void *out[] = {y, q};
    size_t bytes[] = {sizeof y, sizeof q};
    report("good", checks_run(s, in, NULL, out, bytes), s, q);
    idx[1] = 7;
    report("index", checks_run(s, in, NULL, out, bytes), s, q);
    idx[1] = -6;
    report("negative", checks_run(s, in, NULL, out, bytes), s, q);
    idx[1] = -5;
    b[2] = 0;
    report("zero", checks_run(s, in, NULL, out, bytes), s, q);
    b[2] = -3;
    report("again", checks_run(s, in, NULL, out, bytes), s, q);
    checks_close(s);
    return 0;
}
