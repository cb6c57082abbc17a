/*
 * cm_checks.c - librdmacm behaviour that rdma-core's own Python tests (pyverbs) rely on,
 * checked in one process against rdma-core 44's <rdma/rdma_cma.h> and nothing else, so the
 * same binary runs on uroce's drop-in librdmacm.so.1 or on a host with a real RNIC.
 *
 *   a. rdma_getaddrinfo(NULL, NULL, hints) with addresses in the hints: there is no name to
 *      look up, so the answer is the hints (flags, QP type and port space as given, copies of
 *      their addresses), as librdmacm's addrinfo.c answers it; with no hints either, EINVAL.
 *   b. an id that has a device has the device's PD (librdmacm's ucma_get_device sets id->pd
 *      when it sets id->verbs): after rdma_bind_addr, id->verbs and id->pd are set, and two
 *      ids on one device share the PD.
 *   c. loopback: a listener bound to 127.0.0.1 and a client resolving 127.0.0.1 meet on one
 *      device (the kernel's cma_bind_loopback and cma_resolve_loopback: the destination GID is
 *      the source GID).
 *   d. an application's own QP (rdma_connect and rdma_accept with conn_param.qp_num): the
 *      passive side moves its QP to RTS with rdma_init_qp_attr before rdma_accept, the
 *      active side after RDMA_CM_EVENT_CONNECT_RESPONSE and then calls rdma_establish. Each
 *      id's starting PSN is fixed when the id is made, so the sq_psn rdma_init_qp_attr gives
 *      before the REQ or REP is the PSN that REQ or REP carries: a SEND each way completes
 *      with IBV_WC_SUCCESS (a PSN drawn later leaves the receiver expecting another PSN and
 *      the sender ends with IBV_WC_RETRY_EXC_ERR).
 *   e. fork(2): a child of a process whose verbs context and rdma_cm ids are open runs d on
 *      contexts of its own (a child cannot use its parent's contexts, as on a real RNIC, but
 *      may open new ones; pyverbs forks its two sides from a process that has queried the
 *      device), and once the child has exited the parent runs d again: the child's exit left
 *      the parent's device as it was.
 *
 * Run with one uroce device (UROCE_ADDR=127.0.0.2). Exit 0 when every check holds.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>

static int failures;

#define CHECK(cond, ...)                                                                       \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
			fprintf(stderr, __VA_ARGS__);                                          \
			fprintf(stderr, "\n");                                                 \
			failures++;                                                            \
		}                                                                              \
	} while (0)

/* Like CHECK (`cond` evaluated once), but a failure ends the program. */
#define REQUIRE(cond, ...)                                                                     \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
			fprintf(stderr, __VA_ARGS__);                                          \
			fprintf(stderr, "\n");                                                 \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

static struct sockaddr_in loopback(unsigned short port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

/* The next event of `ch`, which must be `expected`; its id through `id`. */
static void expect_event(struct rdma_event_channel *ch, enum rdma_cm_event_type expected,
			 struct rdma_cm_id **id)
{
	struct rdma_cm_event *e;
	REQUIRE(rdma_get_cm_event(ch, &e) == 0, "rdma_get_cm_event: %s", strerror(errno));
	REQUIRE(e->event == expected, "got %s (status %d), expected %s", rdma_event_str(e->event),
		e->status, rdma_event_str(expected));
	if (id)
		*id = e->id;
	rdma_ack_cm_event(e);
}

static void check_addrinfo(void)
{
	struct rdma_addrinfo hints, *res = NULL;
	struct sockaddr_in src = loopback(0);
	memset(&hints, 0, sizeof(hints));
	hints.ai_port_space = RDMA_PS_UDP;
	hints.ai_src_addr = (struct sockaddr *)&src;
	hints.ai_src_len = sizeof(src);
	if (rdma_getaddrinfo(NULL, NULL, &hints, &res) != 0) {
		CHECK(0, "rdma_getaddrinfo(NULL, NULL, hints): %s", strerror(errno));
		return;
	}
	CHECK(res->ai_src_addr && res->ai_src_len == sizeof(src) &&
		      memcmp(res->ai_src_addr, &src, sizeof(src)) == 0,
	      "the hints' source address comes back");
	CHECK(res->ai_src_addr != (struct sockaddr *)&src, "as a copy");
	CHECK(!res->ai_dst_addr && res->ai_dst_len == 0, "no destination: the hints have none");
	CHECK(res->ai_port_space == RDMA_PS_UDP, "port space %d", res->ai_port_space);
	rdma_freeaddrinfo(res);
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL, "errno %d",
	      errno);
}

static void check_pd_after_bind(void)
{
	struct rdma_cm_id *a, *b;
	struct sockaddr_in any = loopback(0);
	REQUIRE(rdma_create_id(NULL, &a, NULL, RDMA_PS_TCP) == 0, "%s", strerror(errno));
	REQUIRE(rdma_create_id(NULL, &b, NULL, RDMA_PS_TCP) == 0, "%s", strerror(errno));
	CHECK(!a->verbs && !a->pd, "no device yet, so no PD");
	REQUIRE(rdma_bind_addr(a, (struct sockaddr *)&any) == 0, "%s", strerror(errno));
	REQUIRE(rdma_bind_addr(b, (struct sockaddr *)&any) == 0, "%s", strerror(errno));
	CHECK(a->verbs && a->pd, "bound: verbs %p pd %p", (void *)a->verbs, (void *)a->pd);
	CHECK(a->pd && a->pd->context == a->verbs, "the PD is the id's device's");
	CHECK(a->verbs != b->verbs || a->pd == b->pd, "ids on one device share its PD");
	rdma_destroy_id(b);
	rdma_destroy_id(a);
}

struct side {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[64];
};

static void make_side(struct side *s, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr init;
	s->cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	REQUIRE(s->cq, "ibv_create_cq: %s", strerror(errno));
	memset(&init, 0, sizeof(init));
	init.qp_type = IBV_QPT_RC;
	init.send_cq = s->cq;
	init.recv_cq = s->cq;
	init.cap.max_send_wr = 4;
	init.cap.max_recv_wr = 4;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(id->pd, &init);
	REQUIRE(s->qp, "ibv_create_qp on id->pd: %s", strerror(errno));
	s->mr = ibv_reg_mr(id->pd, s->buf, sizeof(s->buf), IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(s->mr, "ibv_reg_mr: %s", strerror(errno));
}

/* INIT, RTR, RTS with the attributes the id gives (rdma_init_qp_attr(3)). */
static void to_rts(struct rdma_cm_id *id, struct ibv_qp *qp)
{
	static const enum ibv_qp_state steps[] = { IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS };
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		struct ibv_qp_attr attr;
		int mask;
		memset(&attr, 0, sizeof(attr));
		attr.qp_state = steps[i];
		REQUIRE(rdma_init_qp_attr(id, &attr, &mask) == 0, "rdma_init_qp_attr(%d): %s",
			steps[i], strerror(errno));
		REQUIRE(ibv_modify_qp(qp, &attr, mask) == 0, "ibv_modify_qp(%d): %s", steps[i],
			strerror(errno));
	}
}

static void post_recv(struct side *s)
{
	struct ibv_sge sge = { (uintptr_t)s->buf, sizeof(s->buf), s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	REQUIRE(ibv_post_recv(s->qp, &wr, &bad) == 0, "ibv_post_recv");
}

/* One completion of `s` within 10 s; its status. */
static enum ibv_wc_status completion(struct side *s, enum ibv_wc_opcode *op)
{
	struct timespec start, now;
	struct ibv_wc wc;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		int n = ibv_poll_cq(s->cq, 1, &wc);
		REQUIRE(n >= 0, "ibv_poll_cq");
		if (n == 1) {
			*op = wc.opcode;
			return wc.status;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		REQUIRE(now.tv_sec - start.tv_sec < 10, "no completion in 10 s");
	}
}

static void send_to(struct side *from, struct side *to, const char *text)
{
	struct ibv_sge sge = { (uintptr_t)from->buf, (uint32_t)strlen(text) + 1, from->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;
	enum ibv_wc_status st;
	enum ibv_wc_opcode op;
	strcpy(from->buf, text);
	REQUIRE(ibv_post_send(from->qp, &wr, &bad) == 0, "ibv_post_send");
	st = completion(from, &op);
	CHECK(st == IBV_WC_SUCCESS && op == IBV_WC_SEND, "SEND of \"%s\": %s", text,
	      ibv_wc_status_str(st));
	st = completion(to, &op);
	CHECK(st == IBV_WC_SUCCESS && op == IBV_WC_RECV, "its receive: %s", ibv_wc_status_str(st));
	CHECK(strcmp(to->buf, text) == 0, "received \"%s\"", to->buf);
}

static void check_loopback_with_own_qps(void)
{
	struct rdma_event_channel *pch = rdma_create_event_channel();
	struct rdma_event_channel *ach = rdma_create_event_channel();
	struct rdma_cm_id *listener, *active, *child = NULL;
	struct sockaddr_in lo = loopback(0);
	struct rdma_conn_param param;
	struct side p, a;
	REQUIRE(pch && ach, "rdma_create_event_channel");
	REQUIRE(rdma_create_id(pch, &listener, NULL, RDMA_PS_TCP) == 0, "%s", strerror(errno));
	REQUIRE(rdma_bind_addr(listener, (struct sockaddr *)&lo) == 0, "bind 127.0.0.1: %s",
		strerror(errno));
	REQUIRE(rdma_listen(listener, 4) == 0, "%s", strerror(errno));
	lo.sin_port = rdma_get_src_port(listener);
	CHECK(lo.sin_port != 0, "the listener got a port");

	REQUIRE(rdma_create_id(ach, &active, NULL, RDMA_PS_TCP) == 0, "%s", strerror(errno));
	REQUIRE(rdma_resolve_addr(active, NULL, (struct sockaddr *)&lo, 2000) == 0, "%s",
		strerror(errno));
	expect_event(ach, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
	REQUIRE(rdma_resolve_route(active, 2000) == 0, "%s", strerror(errno));
	expect_event(ach, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
	CHECK(active->verbs == listener->verbs, "127.0.0.1 on both sides is one device");

	make_side(&a, active);
	memset(&param, 0, sizeof(param));
	param.responder_resources = 1;
	param.initiator_depth = 1;
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	param.qp_num = a.qp->qp_num;
	REQUIRE(rdma_connect(active, &param) == 0, "rdma_connect: %s", strerror(errno));

	expect_event(pch, RDMA_CM_EVENT_CONNECT_REQUEST, &child);
	make_side(&p, child);
	to_rts(child, p.qp);
	post_recv(&p);
	param.qp_num = p.qp->qp_num;
	REQUIRE(rdma_accept(child, &param) == 0, "rdma_accept: %s", strerror(errno));

	expect_event(ach, RDMA_CM_EVENT_CONNECT_RESPONSE, NULL);
	to_rts(active, a.qp);
	post_recv(&a);
	REQUIRE(rdma_establish(active) == 0, "rdma_establish: %s", strerror(errno));
	expect_event(pch, RDMA_CM_EVENT_ESTABLISHED, NULL);

	send_to(&p, &a, "from the passive side");
	send_to(&a, &p, "from the active side");

	REQUIRE(rdma_disconnect(active) == 0, "rdma_disconnect: %s", strerror(errno));
	expect_event(ach, RDMA_CM_EVENT_DISCONNECTED, NULL);
	expect_event(pch, RDMA_CM_EVENT_DISCONNECTED, NULL);
	ibv_destroy_qp(a.qp);
	ibv_destroy_qp(p.qp);
	ibv_dereg_mr(a.mr);
	ibv_dereg_mr(p.mr);
	ibv_destroy_cq(a.cq);
	ibv_destroy_cq(p.cq);
	rdma_destroy_id(child);
	rdma_destroy_id(active);
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(ach);
	rdma_destroy_event_channel(pch);
}

static void check_after_fork(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *held;
	struct rdma_cm_id *bound;
	struct sockaddr_in lo = loopback(0);
	int status = 0;
	pid_t child;

	REQUIRE(list && list[0], "ibv_get_device_list");
	held = ibv_open_device(list[0]);
	REQUIRE(held, "ibv_open_device: %s", strerror(errno));
	REQUIRE(rdma_create_id(NULL, &bound, NULL, RDMA_PS_TCP) == 0, "%s", strerror(errno));
	REQUIRE(rdma_bind_addr(bound, (struct sockaddr *)&lo) == 0, "%s", strerror(errno));
	fflush(stdout);
	child = fork();
	REQUIRE(child >= 0, "fork: %s", strerror(errno));
	if (child == 0) {
		/* A child stuck on its parent's device would never finish: 20 s, then SIGALRM. */
		alarm(20);
		check_loopback_with_own_qps();
		_exit(failures ? 1 : 0);
	}
	REQUIRE(waitpid(child, &status, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child %s %d",
	      WIFEXITED(status) ? "exited with" : "was killed by signal",
	      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
	check_loopback_with_own_qps();
	rdma_destroy_id(bound);
	ibv_close_device(held);
	ibv_free_device_list(list);
}

int main(void)
{
	check_addrinfo();
	printf("a. rdma_getaddrinfo without a name: %s\n", failures ? "FAIL" : "ok");
	int before = failures;
	check_pd_after_bind();
	printf("b. a bound id has its device's PD: %s\n", failures > before ? "FAIL" : "ok");
	before = failures;
	check_loopback_with_own_qps();
	printf("c, d. 127.0.0.1 on one device, own QPs through rdma_init_qp_attr: %s\n",
	       failures > before ? "FAIL" : "ok");
	before = failures;
	check_after_fork();
	printf("e. a forked child opens its own device, the parent keeps its own: %s\n",
	       failures > before ? "FAIL" : "ok");
	return failures ? 1 : 0;
}
