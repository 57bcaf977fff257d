# ringlm — top-level build. Sources are found by folder, so adding a .c file to a module
# needs no edit here.  Conventions (see README "Building"):
#   <module>/*.c                  -> that module's static archive
#   <module>/main_<prog>.c        -> program build/bin/<prog> (not in the archive)
#   perf/<name>.c                 -> benchmark build/perf/<name>
#   tests/test_<suite>.c          -> Criterion test program build/tests/test_<suite>
#   fuzz/fuzz_<name>.c            -> libFuzzer target (make fuzz)
#   kernels/cuda/*.cu             -> build/lib/libringlm_cuda.so (plugin, when nvcc is found)
# Every program links every internal archive (the linker only pulls what is used); the
# layering rules (sched/ and shm/ depend on nothing of ours, sim/ never includes daemon/)
# are about includes and are checked by `make check-layering`.

.DEFAULT_GOAL := all
CC       ?= gcc
PREFIX   ?= /usr/local
DESTDIR  ?=
# The version lives in libclient/ringlm.h (RINGLM_VERSION_MAJOR/MINOR/PATCH); read from there.
VERSION  := $(shell awk '/^\#define RINGLM_VERSION_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $$3} END{print v}' libclient/ringlm.h)
SANITIZE ?= 0
TSAN     ?= 0

ifeq ($(SANITIZE),1)
  B       ?= build-asan
  SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined
  CUDA    ?= 0
else ifeq ($(TSAN),1)
  B       ?= build-tsan
  SANFLAGS := -fsanitize=thread
  CUDA    ?= 0
else
  B       ?= build
  SANFLAGS :=
endif

NVCC      ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA      ?= $(if $(NVCC),1,0)
CUDA_ARCH ?= sm_90
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))

OPT      ?= -O2
CFLAGS   ?= $(OPT) -g
CFLAGS   += -std=gnu11 -Wall -Wextra -Werror -fno-omit-frame-pointer -fPIC -pthread \
            -D_GNU_SOURCE -I. -Ilibclient -DRINGLM_VERSION=\"$(VERSION)\" $(SANFLAGS)
LDFLAGS  += -pthread -rdynamic $(SANFLAGS)
SYSLIBS  := -luring -lnuma -lopenblas -lmicrohttpd -linih -ljansson -lxxhash -lpcre2-8 -lutf8proc -lzmq -lmsgpackc -lrt -ldl -lm

OBJ      := $(B)/obj
BIN      := $(B)/bin
LIB      := $(B)/lib

# --- module archives -------------------------------------------------------------------
lib_srcs = $(filter-out $(1)/main_%.c,$(wildcard $(1)/*.c))
SHM_SRCS     := $(call lib_srcs,shm)
CLIENT_SRCS  := $(call lib_srcs,libclient)
MODEL_SRCS   := $(call lib_srcs,model)
CONSTRAIN_SRCS := $(call lib_srcs,constrain)
NUMA_SRCS    := $(call lib_srcs,numa)
SCHED_SRCS   := $(call lib_srcs,sched)
ENGINE_SRCS  := $(call lib_srcs,kernels) $(call lib_srcs,kernels/cpu)
DAEMON_SRCS  := $(call lib_srcs,daemon)
SIM_SRCS     := $(call lib_srcs,sim)
FORMATS_SRCS := $(call lib_srcs,formats)
TOOLS_SRCS   := $(call lib_srcs,tools)
GATEWAY_SRCS := $(call lib_srcs,gateway)

objs = $(patsubst %.c,$(OBJ)/%.o,$(1))

# libringlm = the client library (public API) + the shared-memory transport + model/ (the
# tokenizers and GGUF reader behind the exported tokenizer and chat-template API).
LIBRINGLM_A  := $(LIB)/libringlm.a
LIBRINGLM_SO := $(LIB)/libringlm.so
SCHED_A      := $(LIB)/libringlm_sched.a
NUMA_A       := $(LIB)/libringlm_numa.a
ENGINE_A     := $(LIB)/libringlm_engine.a
CONSTRAIN_A  := $(LIB)/libringlm_constrain.a
DAEMON_A     := $(LIB)/libringlm_daemon.a
SIM_A        := $(LIB)/libringlm_sim.a
FORMATS_A    := $(LIB)/libringlm_formats.a
TOOLS_A      := $(LIB)/libringlm_tools.a
GATEWAY_A    := $(LIB)/libringlm_gateway.a
# Link order: users before what they use.
ALL_A := $(GATEWAY_A) $(TOOLS_A) $(DAEMON_A) $(SIM_A) $(ENGINE_A) $(CONSTRAIN_A) $(SCHED_A) $(FORMATS_A) $(LIBRINGLM_A) $(NUMA_A)

$(LIBRINGLM_A): $(call objs,$(SHM_SRCS) $(CLIENT_SRCS) $(MODEL_SRCS))
$(SCHED_A):     $(call objs,$(SCHED_SRCS))
$(NUMA_A):      $(call objs,$(NUMA_SRCS))
$(ENGINE_A):    $(call objs,$(ENGINE_SRCS))
$(CONSTRAIN_A): $(call objs,$(CONSTRAIN_SRCS))
$(DAEMON_A):    $(call objs,$(DAEMON_SRCS))
$(SIM_A):       $(call objs,$(SIM_SRCS))
$(FORMATS_A):   $(call objs,$(FORMATS_SRCS))
$(TOOLS_A):     $(call objs,$(TOOLS_SRCS))
$(GATEWAY_A):   $(call objs,$(GATEWAY_SRCS))

# Every archive holds empty.o too, so a module with no sources yet still links.
$(ALL_A): $(OBJ)/empty.o
$(LIB)/%.a:
	@mkdir -p $(@D)
	@rm -f $@
	$(AR) rcs $@ $^

# The version script exports ringlm_* only (libclient/libringlm.map).
$(LIBRINGLM_SO): $(call objs,$(SHM_SRCS) $(CLIENT_SRCS) $(MODEL_SRCS)) libclient/libringlm.map
	@mkdir -p $(@D)
	$(CC) -shared -Wl,-soname,libringlm.so.0 -Wl,--version-script=libclient/libringlm.map $(LDFLAGS) \
	    -o $@ $(filter %.o,$^) -ljansson -lpcre2-8 -lutf8proc -lrt
	ln -sf libringlm.so $(@D)/libringlm.so.0   # the soname, so build-tree links run

$(OBJ)/empty.o:
	@mkdir -p $(@D)
	echo 'typedef int ringlm_empty_unit;' | $(CC) $(CFLAGS) -x c -c -o $@ -

$(OBJ)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

# The files that print -DRINGLM_VERSION are rebuilt when it changes: $(B)/version holds the
# version they were built with, rewritten only when it differs.
VERSION_USERS := $(shell grep -l 'RINGLM_VERSION\b' $(wildcard */*.c) 2>/dev/null)
$(call objs,$(VERSION_USERS)): $(B)/version
$(B)/version: FORCE
	@mkdir -p $(@D)
	@[ "$$(cat $@ 2>/dev/null)" = "$(VERSION)" ] || echo "$(VERSION)" > $@
.PHONY: FORCE
FORCE:

# --- programs ----------------------------------------------------------------------------
PROG_MAINS := $(wildcard */main_*.c kernels/*/main_*.c)
PROGRAMS   := $(foreach m,$(PROG_MAINS),$(BIN)/$(patsubst main_%.c,%,$(notdir $(m))))
define prog_rule
$(BIN)/$(patsubst main_%.c,%,$(notdir $(1))): $(call objs,$(1)) $(ALL_A) $(OBJ)/empty.o
	@mkdir -p $$(@D)
	$$(CC) $$(LDFLAGS) -o $$@ $(call objs,$(1)) $(ALL_A) $(SYSLIBS)
endef
$(foreach m,$(PROG_MAINS),$(eval $(call prog_rule,$(m))))

# ringlmd-test: ringlmd with its test knobs (RINGLM_TEST_KNOBS: --prefix-key, --fail-kv-reads),
# for the tests only: built by `make tests`, never by `make all` or installed. Only its main is
# compiled again; the daemon it runs is the shipped one's archive.
TEST_PROGS := $(BIN)/ringlmd-test
$(OBJ)/daemon/main_ringlmd.test.o: daemon/main_ringlmd.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -DRINGLM_TEST_KNOBS -MMD -MP -c -o $@ $<
$(BIN)/ringlmd-test: $(OBJ)/daemon/main_ringlmd.test.o $(ALL_A) $(OBJ)/empty.o
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $< $(ALL_A) $(SYSLIBS)

PERF_SRCS := $(wildcard perf/*.c)
BENCHES   := $(patsubst perf/%.c,$(B)/perf/%,$(PERF_SRCS))
$(B)/perf/%: $(OBJ)/perf/%.o $(ALL_A) $(OBJ)/empty.o
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $< $(ALL_A) $(SYSLIBS)

TEST_SRCS := $(wildcard tests/test_*.c)
TEST_HELPER_SRCS := $(filter-out tests/test_%.c,$(wildcard tests/*.c))
TESTS     := $(patsubst tests/%.c,$(B)/tests/%,$(TEST_SRCS))
$(B)/tests/%: $(OBJ)/tests/%.o $(call objs,$(TEST_HELPER_SRCS)) $(ALL_A) $(OBJ)/empty.o
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $< $(call objs,$(TEST_HELPER_SRCS)) $(ALL_A) $(SYSLIBS) -lcriterion

# --- CUDA plugin -------------------------------------------------------------------------
CU_SRCS := $(wildcard kernels/cuda/*.cu)
CUDA_SO := $(LIB)/libringlm_cuda.so
ifeq ($(CUDA),1)
ifneq ($(CU_SRCS),)
NVCCFLAGS ?= -O3 -lineinfo -arch=$(CUDA_ARCH) -Xcompiler -fPIC,-Wall,-Wextra,-Werror,-fno-omit-frame-pointer \
             -Werror all-warnings -std=c++17 -I. -Ilibclient -D_GNU_SOURCE
$(OBJ)/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c -o $@ $<
# -z nodelete: eng_destroy's dlclose never unloads the CUDA runtime from under a live context.
$(CUDA_SO): $(patsubst %.cu,$(OBJ)/%.cu.o,$(CU_SRCS))
	@mkdir -p $(@D)
	$(NVCC) -shared -arch=$(CUDA_ARCH) -o $@ $^ -L$(CUDA_HOME)/lib64 -lcublas -lcudart \
	    -Xlinker -rpath=$(CUDA_HOME)/lib64 -Xlinker -z,nodelete
CUDA_TARGETS := $(CUDA_SO)
endif
endif

# --- top-level targets -------------------------------------------------------------------
.PHONY: all lib programs benches tests test demo deps install clean fuzz check-layering
all: $(LIBRINGLM_A) $(LIBRINGLM_SO) $(B)/ringlm.pc $(PROGRAMS) $(BENCHES) $(CUDA_TARGETS)
lib: $(ALL_A) $(LIBRINGLM_SO)
programs: $(PROGRAMS)
benches: $(BENCHES)
tests: $(TESTS) $(TEST_PROGS)

# The .pc file names the prefix it is installed under, so install writes it afresh.
PC_TEXT = prefix=$(1)\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: ringlm\nDescription: ringlm client library (shared-memory LLM inference transport)\nVersion: $(VERSION)\nLibs: -L$${libdir} -lringlm\nLibs.private: -ljansson -lpcre2-8 -lutf8proc -lrt\nCflags: -I$${includedir}\n
$(B)/ringlm.pc: Makefile
	@mkdir -p $(@D)
	printf '$(call PC_TEXT,$(PREFIX))' > $@

# make test            : every suite;  make test T=sched : suites whose name starts with that
# Suites run one after another; each suite's own tests run in Criterion's worker processes.
T ?=
RUN_TESTS = $(filter $(B)/tests/test_$(T)%,$(TESTS))
test: all $(TESTS) $(TEST_PROGS) check-layering check-format check-end-codes check-portable check-deploy
	@B=$(B) scripts/run-tests.sh $(RUN_TESTS)

demo: all
	@B=$(B) scripts/demo.sh

deps:
	scripts/install-deps.sh
	scripts/install-node-deps.sh

check-layering:
	@scripts/check-layering.sh

# deploy/'s Kubernetes manifests and systemd units, checked without a cluster (python3-yaml):
# valid YAML, the InferencePool fields the Inference Extension requires, what they point at.
.PHONY: check-deploy
check-deploy:
	@/usr/bin/python3 scripts/check-deploy.py

# ringlm.h's end codes are generated from the one table, common/end_codes.h (see there).
.PHONY: check-end-codes gen-end-codes
check-end-codes:
	@scripts/gen-end-codes.sh --check

gen-end-codes:
	scripts/gen-end-codes.sh

# make check-portable : the reference CPU backend and the modules under it (kernels/ without
# cuda/, model/, sched/, shm/, and common/'s headers) compiled for arm64 with Debian's cross
# compiler, objects only (never linked), warnings as errors: x86 intrinsics stay behind their
# guards, and every kernel keeps a portable C path. Headers that exist only for x86-64 in
# this sysroot are declared by the code that needs them (kernels/cpu/blas.h).
PORTABLE_CC   ?= aarch64-linux-gnu-gcc
PORTABLE_OBJ  := $(B)/portable
PORTABLE_SRCS := $(wildcard kernels/*.c kernels/cpu/*.c model/*.c sched/*.c shm/*.c)
PORTABLE_HDRS := $(wildcard common/*.h)
PORTABLE_FLAGS := -O2 -std=gnu11 -Wall -Wextra -Werror -fPIC -pthread -D_GNU_SOURCE -I. -Ilibclient \
                  -DRINGLM_VERSION=\"$(VERSION)\" -DRINGLM_PORTABLE_CHECK
PORTABLE_OBJS := $(patsubst %.c,$(PORTABLE_OBJ)/%.o,$(PORTABLE_SRCS)) \
                 $(patsubst %.h,$(PORTABLE_OBJ)/%.h.o,$(PORTABLE_HDRS))
.PHONY: check-portable portable-cc
check-portable: $(PORTABLE_OBJS)
	@echo "check-portable: $(words $(PORTABLE_OBJS)) files compile for arm64 ($(PORTABLE_CC))"
portable-cc:
	@command -v $(PORTABLE_CC) >/dev/null || { echo "check-portable: $(PORTABLE_CC) not found" \
	    "(Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross; scripts/install-deps.sh)" >&2; exit 1; }
$(PORTABLE_OBJ)/%.o: %.c | portable-cc
	@mkdir -p $(@D)
	$(PORTABLE_CC) $(PORTABLE_FLAGS) -MMD -MP -c -o $@ $<
$(PORTABLE_OBJ)/%.h.o: %.h | portable-cc
	@mkdir -p $(@D)
	$(PORTABLE_CC) $(PORTABLE_FLAGS) -MMD -MP -x c -c -o $@ $<

# The one C style (.clang-format): check-format runs in make test, format applies it.
.PHONY: check-format format
check-format:
	@scripts/check-format.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

# make tsan : ThreadSanitizer build in build-tsan, then scripts/tsan-check.sh runs every place
# ringlm runs threads as plain programs (Criterion cannot start under TSAN: Snaipe/Criterion#274).
TSAN_PROGS := bin/ringlmd bin/ringlm bin/ringlm-gateway perf/ipc_bench perf/tsan_engine perf/tsan_obs perf/tsan_client
.PHONY: tsan
tsan:
	$(MAKE) TSAN=1 SANITIZE=0 B=build-tsan $(addprefix build-tsan/,$(TSAN_PROGS))
	B=build-tsan scripts/tsan-check.sh

FUZZ_SRCS := $(wildcard fuzz/fuzz_*.c)
fuzz:
	@B=$(B) FUZZ_SRCS="$(FUZZ_SRCS)" scripts/fuzz.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 0644 libclient/ringlm.h $(DESTDIR)$(PREFIX)/include/ringlm.h
	install -m 0644 $(LIBRINGLM_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 0755 $(LIBRINGLM_SO) $(DESTDIR)$(PREFIX)/lib/libringlm.so.0
	ln -sf libringlm.so.0 $(DESTDIR)$(PREFIX)/lib/libringlm.so
	printf '$(call PC_TEXT,$(PREFIX))' > $(DESTDIR)$(PREFIX)/lib/pkgconfig/ringlm.pc
	$(if $(PROGRAMS),install -m 0755 $(PROGRAMS) $(DESTDIR)$(PREFIX)/bin/)
	$(if $(CUDA_TARGETS),install -m 0755 $(CUDA_TARGETS) $(DESTDIR)$(PREFIX)/lib/)

clean:
	rm -rf build build-asan build-tsan

# Objects of programs and tests are kept, so a second make relinks nothing.
.SECONDARY:

-include $(shell find $(OBJ) -name '*.d' 2>/dev/null)
-include $(shell find $(PORTABLE_OBJ) -name '*.d' 2>/dev/null)
