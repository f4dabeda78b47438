# The CPU kernels' builds inside a library: CMakeLists.txt's libedge_cpu_kernels and jetson/'s libedge_sdk include
# this file. kernels/cpu/edge_cpu_isa.h and isa_dispatch.c say how a library holds several builds and chooses one.
#
#   edge_cpu_kernel_objects(NAME <prefix> OUT <variable> [OPTIONS <compile options>...] [DEFINITIONS <definitions>...]
#                           [INCLUDES <directories>...])
#
# makes object libraries named <prefix>_<build> and sets <variable> to all their objects ($<TARGET_OBJECTS:...>),
# isa_dispatch.c's and build_info.c's included, compiled with OPTIONS, DEFINITIONS and INCLUDES. The kernel sources
# also with -ffp-contract=off: they fuse a multiply and an add only where they say so (fmaf, FMA intrinsics), so that
# every instruction set gives the same bits (QUANT.md), where GNU C's default would fuse others on any FMA target;
# and with hidden symbols, each build's functions carrying its name (edge_cpu_isa.h). Which builds:
# - EDGE_SDK_NATIVE_ARCH=ON (the caller's option) on a native build whose compiler takes -march=native: one, for the
#   build machine, the fastest there and the development default;
# - otherwise, with EDGE_SDK_CPU_DISPATCH=ON (the default): one per instruction set of the target architecture that
#   the compiler can make (x86-64: AVX-512 with and without VNNI, AVX2 with and without AVX-VNNI, the x86-64
#   baseline; aarch64: NEON with and without the dot-product instructions), the run time choosing among them, so a
#   package or a cross-built library runs the best code each CPU has;
# - with EDGE_SDK_CPU_DISPATCH=OFF, or on another architecture: one, with the compiler's own flags (CMAKE_C_FLAGS,
#   e.g. -mcpu=cortex-a78ae for a library that runs on Orin only).
option(EDGE_SDK_CPU_DISPATCH
       "Without EDGE_SDK_NATIVE_ARCH: build the CPU kernels for every instruction set of the target and choose at run time"
       ON)

set(EDGE_CPU_KERNEL_DIR "${CMAKE_CURRENT_LIST_DIR}")

# Each build: its name (edge_cpu_isa.h's, best first per architecture) and the flags that make it.
set(EDGE_CPU_BUILDS_X86_64 avx512_vnni avx512 avx2_vnni avx2 portable)
set(EDGE_CPU_FLAGS_avx512_vnni -march=x86-64-v4 -mavx512vnni)
set(EDGE_CPU_FLAGS_avx512 -march=x86-64-v4)
set(EDGE_CPU_FLAGS_avx2_vnni -march=x86-64-v3 -mavxvnni)
set(EDGE_CPU_FLAGS_avx2 -march=x86-64-v3)
set(EDGE_CPU_FLAGS_portable -march=x86-64)
set(EDGE_CPU_BUILDS_AARCH64 neon_dotprod neon)
# Armv8.2-A: GCC's arm_neon.h offers the dot-product intrinsics only there; every core with them implements it.
set(EDGE_CPU_FLAGS_neon_dotprod -march=armv8.2-a+dotprod)
set(EDGE_CPU_FLAGS_neon -march=armv8-a)

function(edge_cpu_kernel_objects)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "NAME;OUT" "OPTIONS;DEFINITIONS;INCLUDES")
  include(CheckCSourceCompiles)
  set(builds "")
  set(single_flags "")
  if(EDGE_SDK_NATIVE_ARCH AND NOT CMAKE_CROSSCOMPILING)
    include(CheckCCompilerFlag)
    check_c_compiler_flag(-march=native EDGE_SDK_HAVE_MARCH_NATIVE)
  endif()
  if(EDGE_SDK_NATIVE_ARCH AND NOT CMAKE_CROSSCOMPILING AND EDGE_SDK_HAVE_MARCH_NATIVE)
    set(single_flags -march=native)
    set(description "one build, for this machine (-march=native)")
  elseif(EDGE_SDK_CPU_DISPATCH AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    set(candidates ${EDGE_CPU_BUILDS_X86_64})
  elseif(EDGE_SDK_CPU_DISPATCH AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
    set(candidates ${EDGE_CPU_BUILDS_AARCH64})
  else()
    set(description "one build, with the compiler's flags")
  endif()
  foreach(build IN LISTS candidates)
    list(JOIN EDGE_CPU_FLAGS_${build} " " CMAKE_REQUIRED_FLAGS)
    check_c_source_compiles("int main(void) { return 0; }" EDGE_SDK_COMPILER_MAKES_${build})
    if(EDGE_SDK_COMPILER_MAKES_${build})
      list(APPEND builds ${build})
    endif()
  endforeach()
  if(candidates)
    list(GET candidates -1 baseline)
    if(NOT baseline IN_LIST builds)
      message(FATAL_ERROR "the compiler does not take ${EDGE_CPU_FLAGS_${baseline}}, the baseline build of the CPU "
                          "kernels: configure with -DEDGE_SDK_CPU_DISPATCH=OFF")
    endif()
    list(JOIN builds " " description)
    set(description "one build per instruction set (${description}), chosen at run time")
  endif()
  message(STATUS "${ARG_NAME}: CPU kernels in ${description}")

  set(objects "")
  set(dispatch_definitions ${ARG_DEFINITIONS})
  if(builds)
    list(APPEND dispatch_definitions EDGE_CPU_ISA_DISPATCH=1)
  else()
    set(builds single)
  endif()
  foreach(build IN LISTS builds)
    set(target ${ARG_NAME}_${build})
    add_library(${target} OBJECT ${EDGE_CPU_KERNEL_DIR}/sparse_ffn.c ${EDGE_CPU_KERNEL_DIR}/predictors.c
                ${EDGE_CPU_KERNEL_DIR}/attention.c)
    if(build STREQUAL "single")
      target_compile_options(${target} PRIVATE ${ARG_OPTIONS} ${single_flags} -ffp-contract=off -fvisibility=hidden)
    else()
      target_compile_options(${target} PRIVATE ${ARG_OPTIONS} ${EDGE_CPU_FLAGS_${build}} -ffp-contract=off
                                               -fvisibility=hidden)
      target_compile_definitions(${target} PRIVATE EDGE_CPU_ISA_BUILD=${build})
      list(APPEND dispatch_definitions EDGE_CPU_HAS_BUILD_${build}=1)
    endif()
    target_compile_definitions(${target} PRIVATE ${ARG_DEFINITIONS})
    target_include_directories(${target} PRIVATE ${EDGE_CPU_KERNEL_DIR} ${ARG_INCLUDES})
    if(OpenMP_C_FOUND)
      target_link_libraries(${target} PRIVATE OpenMP::OpenMP_C)
    endif()
    list(APPEND objects $<TARGET_OBJECTS:${target}>)
  endforeach()
  add_library(${ARG_NAME}_dispatch OBJECT ${EDGE_CPU_KERNEL_DIR}/isa_dispatch.c ${EDGE_CPU_KERNEL_DIR}/build_info.c)
  target_compile_options(${ARG_NAME}_dispatch PRIVATE ${ARG_OPTIONS} ${single_flags})
  target_compile_definitions(${ARG_NAME}_dispatch PRIVATE ${dispatch_definitions})
  target_include_directories(${ARG_NAME}_dispatch PRIVATE ${EDGE_CPU_KERNEL_DIR} ${ARG_INCLUDES})
  if(OpenMP_C_FOUND)
    target_link_libraries(${ARG_NAME}_dispatch PRIVATE OpenMP::OpenMP_C)
  endif()
  list(APPEND objects $<TARGET_OBJECTS:${ARG_NAME}_dispatch>)
  set(${ARG_OUT} ${objects} PARENT_SCOPE)
endfunction()
