# Cross-build for 64-bit ARM Linux (Jetson Orin / Thor run aarch64 Ubuntu) with Debian/Ubuntu's cross compiler:
#   apt-get install gcc-aarch64-linux-gnu && dpkg --add-architecture arm64 && apt-get update &&
#   apt-get install libcjson-dev:arm64
#   cmake -S jetson -B build/jetson-arm64 -DCMAKE_TOOLCHAIN_FILE=$PWD/jetson/cmake/aarch64-linux-gnu.cmake
# Run the results with qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib
# (package qemu-user; jetson/README.md says why the LD_LIBRARY_PATH). On the Jetson itself no
# toolchain file is needed: JetPack's own gcc (aarch64-linux-gnu-gcc is the native compiler there) builds with
# plain `cmake -S jetson -B build/jetson`, and -march=native then targets the Orin's Cortex-A78AE.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Debian multiarch: arm64 libraries live in /usr/lib/aarch64-linux-gnu, headers are shared in /usr/include.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
