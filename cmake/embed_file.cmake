# embed_file.cmake: writes a C file holding the bytes of a file, so the binary carries it.
# cmake -DIN=web/index.html -DOUT=page_html.c -DSYMBOL=srv_page_html -P embed_file.cmake
# gives `const unsigned char SYMBOL[]` (NUL-terminated, for safety) and `const size_t
# SYMBOL_len` (the file's size, without the NUL).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# 16 bytes a line keeps the generated file readable in an editor
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp"
  "/* generated from ${IN} by cmake/embed_file.cmake; do not edit */\n"
  "#include <stddef.h>\n"
  "const unsigned char ${SYMBOL}[] = {\n${bytes}0x00};\n"
  "const size_t ${SYMBOL}_len = ${n};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
