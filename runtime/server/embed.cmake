# embed.cmake: turns a file into a C array at build time (the chat page into the binary).
# usage: cmake -DIN=chat.html -DOUT=srv_chat_html.c -DNAME=srv_chat_html -P embed.cmake
# Defines `const unsigned char NAME[]` (NUL-terminated) and `const size_t NAME_len`.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n  " bytes "${bytes}")
get_filename_component(src "${IN}" NAME)
file(WRITE "${OUT}.tmp"
  "/* generated from ${src} by embed.cmake: do not edit */\n"
  "#include <stddef.h>\n\n"
  "extern const unsigned char ${NAME}[];\n"
  "extern const size_t ${NAME}_len;\n"
  "const unsigned char ${NAME}[] = {\n  ${bytes}0x00};\n"
  "const size_t ${NAME}_len = ${len};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
