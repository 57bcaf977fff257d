/* SPDX-License-Identifier: MIT */
/* common/errdetail.h: the one error-detail mechanism — a detail may wrap the one it replaces,
 * long text is cut at ERRDETAIL_MAX without overrunning, and each thread reads its own. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "common/errdetail.h"
#include "kernels/engine.h"

ERRDETAIL_DEFINE(detail);

Test(common_errdetail, returns_the_code_and_wraps_itself)
{
    cr_assert_str_eq(detail.msg, "", "a thread starts with no detail");
    cr_assert_eq(errdetail_set(&detail, -ENOENT, "tensor %s missing", "wq"), -ENOENT);
    cr_assert_eq(errdetail_set(&detail, -ENOENT, "model m.bin: %s", detail.msg), -ENOENT);
    cr_assert_str_eq(detail.msg, "model m.bin: tensor wq missing");
}

Test(common_errdetail, long_text_is_cut_not_overrun)
{
    char big[2 * ERRDETAIL_MAX];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    errdetail_set(&detail, -EINVAL, "%s", big);
    cr_assert_eq(strlen(detail.msg), (size_t)ERRDETAIL_MAX - 1);
}

/* The modules' getters sit on it: the engine's detail may name itself to add context. */
Test(common_errdetail, engine_detail_wraps_itself)
{
    eng_seterr(-EINVAL, "dim %d", 7);
    cr_assert_eq(eng_seterr(-EINVAL, "loading: %s", eng_errmsg()), -EINVAL);
    cr_assert_str_eq(eng_errmsg(), "loading: dim 7");
}

static void *other_thread(void *arg)
{
    (void)arg;
    errdetail_set(&detail, -EIO, "from the other thread");
    return strcmp(detail.msg, "from the other thread") == 0 ? (void *)1 : NULL;
}

Test(common_errdetail, each_thread_reads_its_own)
{
    errdetail_set(&detail, -EINVAL, "from the test thread");
    pthread_t t;
    void *ok = NULL;
    cr_assert_eq(pthread_create(&t, NULL, other_thread, NULL), 0);
    cr_assert_eq(pthread_join(t, &ok), 0);
    cr_assert_not_null(ok);
    cr_assert_str_eq(detail.msg, "from the test thread");
}
