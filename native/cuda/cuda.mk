# cuda.mk - the CUDA backend's tools and its CPU-emulated test build (included by ../Makefile,
# which builds build/libgyre_cuda.so itself). None of these is part of `all`.
#
#   cuda-tools      build/gyre-cuda-check (CUDA vs CPU comparison and GPU timing, through the
#                   ABI) and, with nvcc, build/gyre-cuda-probe (bandwidth, SGEMM rate)
#   cuda-emu        cuda/*.cu compiled as C++ against the emulator of cuda/emu, with
#                   AddressSanitizer and UBSan: build/emu/libgyre_cuda_emu.so (+ its checker)
#   cuda-emu-check  the comparison of the emulated CUDA build against the CPU build (compare
#                   and long, --quick): runs the CUDA kernels' indexing and synchronisation on
#                   a machine without a GPU

EMU_CXX ?= g++
EMU_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
EMU_FLAGS := -O1 -g $(EMU_SAN) -fPIC -Wall -Wextra -Wno-unknown-pragmas -Wno-unused-parameter -Wno-clobbered \
             -Iinclude -Isrc -MMD -MP
EMU_CU_OBJ := $(CUDA_SRC:cuda/%.cu=build/emu/cu/%.o) build/emu/cu/emu.o
EMU_C_OBJ := $(COMMON_SRC:src/%.c=build/emu/c/%.o)
CHECK_FLAGS := -O2 -std=c11 -Wall -Wextra -Iinclude

cuda-tools: build/gyre-cuda-check $(if $(NVCC),build/gyre-cuda-probe build/gyre-cuda-gemm-check)
cuda-emu: build/emu/libgyre_cuda_emu.so build/emu/gyre-cuda-check build/emu/gyre-cuda-gemm-check

cuda-emu-check: cuda-emu build/libgyre_cpu.so
	@ASAN_OPTIONS=detect_leaks=0 build/emu/gyre-cuda-gemm-check
	@ASAN_OPTIONS=detect_leaks=0 build/emu/gyre-cuda-check compare --quick --cpu build/libgyre_cpu.so \
	  --cuda build/emu/libgyre_cuda_emu.so
	@ASAN_OPTIONS=detect_leaks=0 build/emu/gyre-cuda-check long --quick --long 512 --cpu build/libgyre_cpu.so \
	  --cuda build/emu/libgyre_cuda_emu.so

build/gyre-cuda-check: cuda/tools/check.c include/gyre.h src/half.h
	@mkdir -p $(@D)
	@$(CC) $(CHECK_FLAGS) -o $@ $< -ldl -lm

build/emu/gyre-cuda-check: cuda/tools/check.c include/gyre.h src/half.h
	@mkdir -p $(@D)
	@$(CC) $(CHECK_FLAGS) -g $(EMU_SAN) -o $@ $< -ldl -lm

build/gyre-cuda-probe: cuda/tools/probe.cu build/obj/cuda/gemm.o build/obj/cuda/device.o build/obj/common/errors.o
	@$(NVCC) -O3 -arch=sm_90 -std=c++17 -Iinclude -Isrc -cudart static -o $@ $^

build/gyre-cuda-gemm-check: cuda/tools/gemm_check.cu build/obj/cuda/gemm.o build/obj/cuda/device.o \
                            build/obj/common/errors.o
	@$(NVCC) -O3 -arch=sm_90 -std=c++17 -Iinclude -Isrc -cudart static -o $@ $^

build/emu/gyre-cuda-gemm-check: build/emu/cu/tools/gemm_check.o build/emu/cu/gemm.o build/emu/cu/device.o \
                                build/emu/cu/emu.o build/emu/c/common/errors.o
	@$(EMU_CXX) $(EMU_SAN) -o $@ $^ -lm

build/emu/libgyre_cuda_emu.so: $(EMU_CU_OBJ) $(EMU_C_OBJ)
	@$(EMU_CXX) -shared $(EMU_SAN) -o $@ $^ -lm

build/emu/cu/emu.o: cuda/emu/emu.cpp
	@mkdir -p $(@D)
	@$(EMU_CXX) -std=c++17 $(EMU_FLAGS) -c $< -o $@

build/emu/cu/%.o: cuda/%.cu
	@mkdir -p $(@D)
	@$(EMU_CXX) -std=c++17 -x c++ $(EMU_FLAGS) -Icuda/emu -c $< -o $@

build/emu/c/%.o: src/%.c
	@mkdir -p $(@D)
	@$(CC) -std=c11 $(EMU_FLAGS) -c $< -o $@

.PHONY: cuda-tools cuda-emu cuda-emu-check

-include $(EMU_CU_OBJ:.o=.d) $(EMU_C_OBJ:.o=.d) build/emu/cu/tools/gemm_check.d
