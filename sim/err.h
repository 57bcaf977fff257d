/* ringlm — simulator error detail. SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_ERR_H
#define RINGLM_SIM_ERR_H

/* Functions of sim/ return 0 or a negative errno; the sentence that explains the error
 * ("trace.csv:17: ContextTokens is 0, must be positive") is kept in a thread-local string
 * so callers print one line instead of guessing from -EINVAL. */

/* Sets the detail string (printf format). Returns -EINVAL so callers can `return sim_err_set(...)`. */
int sim_err_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Same, returning the given negative errno. */
int sim_err_setc(int neg_errno, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last detail string set on this thread ("" when none). */
const char *sim_err(void);

#endif
