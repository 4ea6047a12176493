/*
 * cartpole.c - CartPole written in C (the standard equations: Barto, Sutton & Anderson 1983, as
 * gymnasium's CartPole-v1) learning through rlinkd, with server-side actions or (--inference
 * client, shm:// addresses) the policy run here on the daemon's weights board.
 *
 *     cartpole --help
 *     cartpole ADDRESS [--agents N] [--target R] [--max-seconds S] [--max-steps N] [--token T]
 *                      [--inference server|client] [--seed S] [--evaluate 1]
 *
 * --evaluate 1 plays evaluation episodes (greedy actions, never trained; returns reported).
 * Steps N copies of the cart (one STEP_BATCH per step for all of them) until the mean return of
 * the last 20 episodes reaches R (exit 0) or the time/step budget runs out (exit 1). Prints a
 * progress line every 2 s and a final JSON line {"solved", "episodes", "steps", "seconds",
 * "steps_per_s", "mean_return_20", "reconnects"}. Run the daemon with env.id = CartPole-v1.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rlinkd.h"

#define MAX_AGENTS 256
#define WINDOW 20

typedef struct {
    double x, x_dot, theta, theta_dot;
    int steps;
    float ret;
} cart;

static uint64_t rng_state = 88172645463325252ull;

static double uniform(double lo, double hi) {  /* xorshift64 */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}

static void reset(cart *c) {
    c->x = uniform(-0.05, 0.05);
    c->x_dot = uniform(-0.05, 0.05);
    c->theta = uniform(-0.05, 0.05);
    c->theta_dot = uniform(-0.05, 0.05);
    c->steps = 0;
    c->ret = 0.0f;
}

static void observe(const cart *c, float *obs) {
    obs[0] = (float)c->x;
    obs[1] = (float)c->x_dot;
    obs[2] = (float)c->theta;
    obs[3] = (float)c->theta_dot;
}

/* One step of the physics (Euler, tau = 0.02 s); 1 when the pole fell or the cart left. */
static int physics(cart *c, int push_right) {
    const double gravity = 9.8, masscart = 1.0, masspole = 0.1, length = 0.5, force_mag = 10.0, tau = 0.02;
    const double total_mass = masspole + masscart, polemass_length = masspole * length;
    double force = push_right ? force_mag : -force_mag;
    double costheta = cos(c->theta), sintheta = sin(c->theta);
    double temp = (force + polemass_length * c->theta_dot * c->theta_dot * sintheta) / total_mass;
    double thetaacc = (gravity * sintheta - costheta * temp) /
                      (length * (4.0 / 3.0 - masspole * costheta * costheta / total_mass));
    double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    c->x += tau * c->x_dot;
    c->x_dot += tau * xacc;
    c->theta += tau * c->theta_dot;
    c->theta_dot += tau * thetaacc;
    c->steps++;
    const double theta_limit = 12.0 * 3.14159265358979323846 / 180.0;
    return c->x < -2.4 || c->x > 2.4 || c->theta < -theta_limit || c->theta > theta_limit;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    float returns[WINDOW];
    long episodes;
} tally;

static void record(tally *t, float ret) { t->returns[t->episodes++ % WINDOW] = ret; }

/* The mean return of the last WINDOW episodes (of all of them while fewer; 0 before any). */
static double mean_last(const tally *t) {
    int n = t->episodes < WINDOW ? (int)t->episodes : WINDOW;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += t->returns[i];
    return n ? sum / n : 0.0;
}

typedef struct {
    const char *address, *token;
    int agents, client_inference, evaluate;
    unsigned long long seed;
    double target, max_seconds;
    long max_steps;
} args;

static int parse_args(int argc, char **argv, args *a) {
    a->address = argc > 1 && strncmp(argv[1], "--", 2) != 0 ? argv[1] : NULL;
    a->token = NULL;
    a->agents = 1;
    a->target = 450.0;
    a->max_seconds = 300.0;
    a->max_steps = 0;
    a->client_inference = 0;
    a->evaluate = 0;
    a->seed = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--agents")) a->agents = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--target")) a->target = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-seconds")) a->max_seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-steps")) a->max_steps = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--token")) a->token = argv[i + 1];
        else if (!strcmp(argv[i], "--seed")) a->seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--evaluate")) a->evaluate = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--inference") && !strcmp(argv[i + 1], "client")) a->client_inference = 1;
        else if (strcmp(argv[i], "--inference") != 0 || strcmp(argv[i + 1], "server") != 0) return -1;
    }
    return a->address && a->agents >= 1 && a->agents <= MAX_AGENTS ? 0 : -1;
}

/* One step of every cart: act, apply, step; finished episodes reset. */
static rlk_status step_all(rlk_client *c, cart *carts, int n, tally *t) {
    static float obs[MAX_AGENTS * 4], actions[MAX_AGENTS], rewards[MAX_AGENTS];
    static unsigned char term[MAX_AGENTS], trunc[MAX_AGENTS];
    for (int i = 0; i < n; i++) observe(&carts[i], obs + 4 * i);
    rlk_status st = rlk_act_batch(c, n, obs, actions);
    if (st != RLK_OK) return st;
    for (int i = 0; i < n; i++) {
        term[i] = (unsigned char)physics(&carts[i], actions[i] > 0.5f);
        trunc[i] = !term[i] && carts[i].steps >= 500;
        rewards[i] = 1.0f;
        carts[i].ret += 1.0f;
        observe(&carts[i], obs + 4 * i);
    }
    st = rlk_step_batch(c, n, rewards, obs, term, trunc);
    for (int i = 0; i < n; i++)
        if (term[i] || trunc[i]) {
            record(t, carts[i].ret);
            reset(&carts[i]);
        }
    return st;
}

static void usage(FILE *to, const char *argv0) {
    fprintf(to, "usage: %s ADDRESS [--agents N] [--target R] [--max-seconds S] [--max-steps N] [--token T]"
                " [--inference server|client] [--seed S] [--evaluate 1]\n"
                "ADDRESS: tcp://HOST:PORT, unix:///PATH, shm, shm:STATE_DIR or shm:///PATH/rlinkd.sock\n"
                "Steps N CartPole carts through the daemon until the mean return of the last 20 episodes\n"
                "reaches R (exit 0) or the budget runs out (exit 1); 2: bad arguments or no connection.\n",
            argv0);
}

int main(int argc, char **argv) {
    args a;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout, argv[0]);
            return 0;
        }
    if (parse_args(argc, argv, &a) != 0) {
        usage(stderr, argv[0]);
        return 2;
    }
    rlk_options o;
    rlk_options_init(&o);
    o.address = a.address;
    o.token = a.token;
    o.max_agents = a.agents;
    o.client_inference = a.client_inference;
    o.seed = a.seed;
    o.evaluate = a.evaluate;
    rlk_client *c;
    rlk_status st = rlk_connect(&o, &c);
    if (st != RLK_OK || rlk_obs_size(c) != 4 || rlk_action_n(c) != 2) {
        /* (rlk_error(NULL): this thread's last rlk_connect failure) */
        fprintf(stderr, "cannot connect as CartPole: %s: %s\n", rlk_status_name(st),
                c ? "not CartPole's spaces (4 floats, Discrete(2))" : rlk_error(NULL));
        rlk_close(c);
        return 2;
    }
    cart carts[MAX_AGENTS];
    tally t = {{0}, 0};
    for (int i = 0; i < a.agents; i++) reset(&carts[i]);
    double start = now_s(), last_print = start;
    long steps = 0;
    int solved = 0;
    while (st == RLK_OK && !solved && now_s() - start < a.max_seconds && (!a.max_steps || steps < a.max_steps)) {
        st = step_all(c, carts, a.agents, &t);
        steps += a.agents;
        solved = t.episodes >= WINDOW && mean_last(&t) >= a.target;
        if (now_s() - last_print >= 2.0) {
            last_print = now_s();
            printf("[%6.1fs] steps %ld episodes %ld mean return (last 20) %.1f weights %ld\n",
                   last_print - start, steps, t.episodes, mean_last(&t), rlk_weights_seq_no(c));
            fflush(stdout);
        }
    }
    if (st != RLK_OK) fprintf(stderr, "stopped: %s: %s\n", rlk_status_name(st), rlk_error(c));
    double took = now_s() - start;
    printf("{\"solved\": %s, \"episodes\": %ld, \"steps\": %ld, \"seconds\": %.2f, \"steps_per_s\": %.0f, "
           "\"mean_return_20\": %.1f, \"reconnects\": %d, \"status\": \"%s\"}\n",
           solved ? "true" : "false", t.episodes, steps, took, steps / (took > 0 ? took : 1), mean_last(&t),
           rlk_reconnects(c), rlk_status_name(st));
    rlk_close(c);
    return solved ? 0 : 1;
}
