# cuemu_gen.cmake: the emulator's C++ translation unit for one kernels/cuda file: cuemu.h, the
# test's defines, the source (in an unnamed namespace, so helpers of different files never
# collide), and a table of its extern "C" __global__ entries. The entries are read from the
# preprocessed source, so those that macros define count too.
# usage: cmake -DSRC=kernels/cuda/x.cu -DIN=x.ii -DNAME=x "-DDEFS=A=1 B=2" -DOUT=x.cpp
#              -P cuemu_gen.cmake
file(READ "${IN}" text)
set(ws "[ \t\r\n]")
set(id "[A-Za-z_][A-Za-z0-9_]*")
set(paren "\\(([^()]|\\([^()]*\\))*\\)")
# extern "C" __global__, then words such as void or __launch_bounds__(...), then name(
string(REGEX MATCHALL "extern${ws}+\"C\"${ws}+__global__(${ws}+${id}${ws}*(${paren})?)*${ws}*\\("
       hits "${text}")
set(body "// generated from ${SRC} by tests/cuemu/cuemu_gen.cmake: do not edit\n")
string(APPEND body "#include \"cuemu.h\"\n")
string(REPLACE " " ";" defs "${DEFS}")
foreach(d ${defs})
  string(REPLACE "=" " " d "${d}")
  string(APPEND body "#define ${d}\n")
endforeach()
set(renames "")
set(table "")
set(n 0)
foreach(hit ${hits})
  string(REGEX REPLACE "^.*[^A-Za-z0-9_](${id})${ws}*\\($" "\\1" fn "${hit}")
  string(APPEND renames "#define ${fn} cuemu_${NAME}_${fn}\n")
  string(APPEND table "  cuemu_kernel_of(\"${NAME}\", \"${fn}\", cuemu_${NAME}_${fn}),\n")
  math(EXPR n "${n} + 1")
endforeach()
if(n EQUAL 0)
  message(FATAL_ERROR "${SRC}: no extern \"C\" __global__ entry found")
endif()
# The entries keep C linkage: renamed, they never clash with the CPU kernels' kn_* names.
string(APPEND body "${renames}namespace {\n#include \"${SRC}\"\n} // namespace\n\n")
string(APPEND body "static const cuemu_kernel cuemu_kernels[] = {\n${table}};\n")
string(APPEND body "static cuemu_module cuemu_registered(cuemu_kernels, ${n});\n")
file(WRITE "${OUT}.tmp" "${body}")
file(RENAME "${OUT}.tmp" "${OUT}")
