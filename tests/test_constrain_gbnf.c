/* SPDX-License-Identifier: MIT */
/*
 * constrain/ GBNF: llama.cpp's example grammars (grammars/<name>.gbnf, MIT, copied verbatim)
 * compile and accept and refuse what llama.cpp's own grammar engine does (the expectations
 * were checked against llama_grammar_accept of llama.cpp's src/llama-grammar.cpp); the
 * syntax as llama.cpp reads it (newlines, comments, escapes, repeats); recursion, deep
 * right recursion included; masks agree with accepting; bad grammars are errors that name
 * the line and the rule.
 */
#include "constrain/cst.h"
#include "tests/constrain_test_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* token 0: the end token; 1..255: bytes 1..255; then a few multi-byte tokens */
static const char *const multi[] = {"ab", "{\"", "\": ", "\xc3\xa9", "\xe3\x81", "- ", "int "};
#define N_MULTI (sizeof multi / sizeof multi[0])
#define N_TOK   (256 + (int)N_MULTI)

static cst_vocab *byte_vocab(void)
{
    return ctu_byte_vocab(multi, N_MULTI);
}

static cst_grammar *gbnf(const char *src)
{
    cst_grammar *g;
    char err[512];
    int rc = cst_compile_gbnf(src, strlen(src), &g, err, sizeof err);
    cr_assert_eq(rc, 0, "grammar %s: %d %s", src, rc, err);
    return g;
}

static void check(const char *name, const char *src, const char *const *yes, const char *const *no)
{
    cst_vocab *v = byte_vocab();
    cst_grammar *g = gbnf(src);
    for (; *yes; yes++) cr_expect(ctu_full_match(g, v, *yes), "%s should match \"%s\"", name, *yes);
    for (; *no; no++)
        cr_expect(!ctu_full_match(g, v, *no), "%s should not match \"%s\"", name, *no);
    cst_grammar_free(g);
    cst_vocab_free(v);
}

static const struct example {
    const char *name, *src;
    const char *const *yes, *const *no;
} examples[] = {
    {"arithmetic.gbnf",
     "root  ::= (expr \"=\" ws term \"\\n\")+\n"
     "expr  ::= term ([-+*/] term)*\n"
     "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
     "ident ::= [a-z] [a-z0-9_]* ws\n"
     "num   ::= [0-9]+ ws\n"
     "ws    ::= [ \\t\\n]*\n",
     (const char *[]){"1+2= 3\n", "a*(b+c)= x\n", "x= y\nfoo = 12\n", "(a)=b\n", "x1_y= (z)\n",
                      NULL},
     (const char *[]){"", "1+2=3", "1+= 3\n", "A= b\n", "(a= b\n", "1 2= 3\n", NULL}},
    {"c.gbnf",
     "root ::= (declaration)*\n"
     "\n"
     "declaration ::= dataType identifier \"(\" parameter? \")\" \"{\" statement* \"}\"\n"
     "\n"
     "dataType  ::= \"int\" ws | \"float\" ws | \"char\" ws\n"
     "identifier ::= [a-zA-Z_] [a-zA-Z_0-9]*\n"
     "\n"
     "parameter ::= dataType identifier\n"
     "\n"
     "statement ::=\n"
     "    ( dataType identifier ws \"=\" ws expression \";\" ) |\n"
     "    ( identifier ws \"=\" ws expression \";\" ) |\n"
     "    ( identifier ws \"(\" argList? \")\" \";\" ) |\n"
     "    ( \"return\" ws expression \";\" ) |\n"
     "    ( \"while\" \"(\" condition \")\" \"{\" statement* \"}\" ) |\n"
     "    ( \"for\" \"(\" forInit \";\" ws condition \";\" ws forUpdate \")\" \"{\" statement* "
     "\"}\" ) |\n"
     "    ( \"if\" \"(\" condition \")\" \"{\" statement* \"}\" (\"else\" \"{\" statement* \"}\")? "
     ") |\n"
     "    ( singleLineComment ) |\n"
     "    ( multiLineComment )\n"
     "\n"
     "forInit ::= dataType identifier ws \"=\" ws expression | identifier ws \"=\" ws expression\n"
     "forUpdate ::= identifier ws \"=\" ws expression\n"
     "\n"
     "condition ::= expression relationOperator expression\n"
     "relationOperator ::= (\"<=\" | \"<\" | \"==\" | \"!=\" | \">=\" | \">\")\n"
     "\n"
     "expression ::= term ((\"+\" | \"-\") term)*\n"
     "term ::= factor((\"*\" | \"/\") factor)*\n"
     "\n"
     "factor ::= identifier | number | unaryTerm | funcCall | parenExpression\n"
     "unaryTerm ::= \"-\" factor\n"
     "funcCall ::= identifier \"(\" argList? \")\"\n"
     "parenExpression ::= \"(\" ws expression ws \")\"\n"
     "\n"
     "argList ::= expression (\",\" ws expression)*\n"
     "\n"
     "number ::= [0-9]+\n"
     "\n"
     "singleLineComment ::= \"//\" [^\\n]* \"\\n\"\n"
     "multiLineComment ::= \"/*\" ( [^*] | (\"*\" [^/]) )* \"*/\"\n"
     "\n"
     "ws ::= ([ \\t\\n]+)\n",
     (const char *[]){"", "int main(){return 0;}", "int f(int x){x = x+1;while(x<3){x = x*2;}}",
                      "char c(){// hi\n}", "float g(){/* a * b */}",
                      "int h(){if(a<b){g (a, b);}else{}}", NULL},
     (const char *[]){"int main()", "int 1x(){}", "void f(){}", "int f(){return 0}",
                      "int f(){/* a */ */}", NULL}},
    {"chess.gbnf",
     "# Specifies chess moves as a list in algebraic notation, using PGN conventions\n"
     "\n"
     "# Force first move to \"1. \", then any 1-2 digit number after, relying on model to follow "
     "the pattern\n"
     "root    ::= \"1. \" move \" \" move \"\\n\" ([1-9] [0-9]? \". \" move \" \" move \"\\n\")+\n"
     "move    ::= (pawn | nonpawn | castle) [+#]?\n"
     "\n"
     "# piece type, optional file/rank, optional capture, dest file & rank\n"
     "nonpawn ::= [NBKQR] [a-h]? [1-8]? \"x\"? [a-h] [1-8]\n"
     "\n"
     "# optional file & capture, dest file & rank, optional promotion\n"
     "pawn    ::= ([a-h] \"x\")? [a-h] [1-8] (\"=\" [NBKQR])?\n"
     "\n"
     "castle  ::= \"O-O\" \"-O\"?\n",
     (const char *[]){"1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n12. O-O O-O-O+\n",
                      "1. e4 e5\n2. exd5 Qxd5#\n", "1. e4 e5\n2. e8=Q Kxe8\n", NULL},
     (const char *[]){"1. e4 e5\n", "1. e4 e5\n2. Nf3\n", "1. e9 e5\n2. Nf3 Nc6\n",
                      "1. e4 e5\n02. Nf3 Nc6\n", "1. e4 e5\n2. Nf3 Nc6", NULL}},
    {"english.gbnf",
     "# note: this might be incomplete, mostly an example\n"
     "root        ::= en-char+ ([ \\t\\n] en-char+)*\n"
     "en-char     ::= letter | digit | punctuation\n"
     "letter      ::= [a-zA-Z]\n"
     "digit       ::= [0-9]\n"
     "punctuation ::= [!\"#$%&'()*+,-./:;<=>?@[\\\\\\]^_`{|}~]\n",
     (const char *[]){"Hello, world!", "a b\tc\nd", "x", "[x]{y}\\z", NULL},
     (const char *[]){"", " a", "a  b",
                      "caf\xc3"
                      "\xa9"
                      "",
                      "a\n", NULL}},
    {"japanese.gbnf",
     "# A probably incorrect grammar for Japanese\n"
     "root        ::= jp-char+ ([ \\t\\n] jp-char+)*\n"
     "jp-char     ::= hiragana | katakana | punctuation | cjk\n"
     "hiragana    ::= [\xe3"
     "\x81"
     "\x81"
     "-\xe3"
     "\x82"
     "\x9f"
     "]\n"
     "katakana    ::= [\xe3"
     "\x82"
     "\xa1"
     "-\xe3"
     "\x83"
     "\xbf"
     "]\n"
     "punctuation ::= [\xe3"
     "\x80"
     "\x81"
     "-\xe3"
     "\x80"
     "\xbe"
     "]\n"
     "cjk         ::= [\xe4"
     "\xb8"
     "\x80"
     "-\xe9"
     "\xbf"
     "\xbf"
     "]\n",
     (const char *[]){"\xe3"
                      "\x81"
                      "\x93"
                      "\xe3"
                      "\x82"
                      "\x93"
                      "\xe3"
                      "\x81"
                      "\xab"
                      "\xe3"
                      "\x81"
                      "\xa1"
                      "\xe3"
                      "\x81"
                      "\xaf"
                      "",
                      "\xe3"
                      "\x82"
                      "\xab"
                      "\xe3"
                      "\x82"
                      "\xbf"
                      "\xe3"
                      "\x82"
                      "\xab"
                      "\xe3"
                      "\x83"
                      "\x8a"
                      " \xe6"
                      "\xbc"
                      "\xa2"
                      "\xe5"
                      "\xad"
                      "\x97"
                      "\n\xe3"
                      "\x80"
                      "\x81"
                      "",
                      "\xe3"
                      "\x81"
                      "\x82"
                      "",
                      NULL},
     (const char *[]){"", "a",
                      "\xe3"
                      "\x81"
                      "\x82"
                      " ",
                      "\xe3"
                      "\x81"
                      "\x82"
                      "\xc3"
                      "\xa9"
                      "",
                      "\xf0"
                      "\x9f"
                      "\x98"
                      "\x80"
                      "",
                      NULL}},
    {"json.gbnf",
     "root   ::= object\n"
     "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
     "\n"
     "object ::=\n"
     "  \"{\" ws (\n"
     "            string \":\" ws value\n"
     "    (\",\" ws string \":\" ws value)*\n"
     "  )? \"}\" ws\n"
     "\n"
     "array  ::=\n"
     "  \"[\" ws (\n"
     "            value\n"
     "    (\",\" ws value)*\n"
     "  )? \"]\" ws\n"
     "\n"
     "string ::=\n"
     "  \"\\\"\" (\n"
     "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
     "    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
     "  )* \"\\\"\" ws\n"
     "\n"
     "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] "
     "[1-9]{0,15})? ws\n"
     "\n"
     "# Optional space: by convention, applied in this grammar after literal chars when allowed\n"
     "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n",
     (const char *[]){"{\"a\": 1, \"b\": [true, null, \"x\\n\"], \"c\": {\"d\": -1.5e15}}", "{}",
                      "{\"k\":\"\\u00e9\"}", "{ \"a\" : [ ] }",
                      "{\"\xc3"
                      "\xa9"
                      "\": \"\xe6"
                      "\xbc"
                      "\xa2"
                      "\"}",
                      NULL},
     (const char *[]){"[]", "{\"a\": 1,}", "{\"a\": 01}", "{\"a\": \"\\x\"}",
                      "{\"a\": \"\x01"
                      "\"}",
                      "{a: 1}", "{\"a\": tru}", NULL}},
    {"json_arr.gbnf",
     "# This is the same as json.gbnf but we restrict whitespaces at the end of the root array\n"
     "# Useful for generating JSON arrays\n"
     "\n"
     "root   ::= arr\n"
     "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
     "\n"
     "arr  ::=\n"
     "  \"[\\n\" ws (\n"
     "            value\n"
     "    (\",\\n\" ws value)*\n"
     "  )? \"]\"\n"
     "\n"
     "object ::=\n"
     "  \"{\" ws (\n"
     "            string \":\" ws value\n"
     "    (\",\" ws string \":\" ws value)*\n"
     "  )? \"}\" ws\n"
     "\n"
     "array  ::=\n"
     "  \"[\" ws (\n"
     "            value\n"
     "    (\",\" ws value)*\n"
     "  )? \"]\" ws\n"
     "\n"
     "string ::=\n"
     "  \"\\\"\" (\n"
     "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
     "    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
     "  )* \"\\\"\" ws\n"
     "\n"
     "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [1-9] "
     "[0-9]{0,15})? ws\n"
     "\n"
     "# Optional space: by convention, applied in this grammar after literal chars when allowed\n"
     "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n",
     (const char *[]){"[\n{\"a\": 1}]", "[\n1,\n\"x\"]", "[\n]", NULL},
     (const char *[]){"[1]", "[\n1,2]", "{}", "[\n1]\n", NULL}},
    {"list.gbnf",
     "root ::= item+\n"
     "\n"
     "# Excludes various line break characters\n"
     "item ::= \"- \" [^\\r\\n\\x0b\\x0c\\x85\\u2028\\u2029]+ \"\\n\"\n",
     (const char *[]){"- a\n", "- hello world\n- two\n",
                      "- \xc3"
                      "\xa9"
                      "\n",
                      NULL},
     (const char *[]){"", "- \n", "-a\n", "- a",
                      "- a\xe2"
                      "\x80"
                      "\xa8"
                      "b\n",
                      "- a\rb\n", NULL}},
};

Test(constrain_gbnf, llama_cpp_example_grammars)
{
    for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++)
        check(examples[i].name, examples[i].src, examples[i].yes, examples[i].no);
}

Test(constrain_gbnf, syntax_as_llama_cpp_reads_it)
{
    /* comments, blank lines, a rule body on the next line, \r\n line ends */
    check("comments", "\n# a grammar\n\nroot ::= # the start\n  \"a\" b # then b\r\nb ::= \"b\"\n",
          (const char *[]){"ab", NULL}, (const char *[]){"a", "b", NULL});
    /* a newline continues a rule after '|' and inside parentheses */
    check("newlines", "root ::= \"a\" |\n  \"b\" (\"c\"\n \"d\")",
          (const char *[]){"a", "bcd", NULL}, (const char *[]){"bc", NULL});
    /* escapes in literals and classes, code points in UTF-8 */
    check(
        "escapes", "root ::= \"\\x41\\u00e9\\U0001F600\\t\\\"\\\\\" [\\[\\]\\-] [^\\n\\x00-\\x1f]",
        (const char *[]){"A\xc3\xa9\xf0\x9f\x98\x80\t\"\\-x",
                         "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\]"
                         "\xe6\xbc\xa2",
                         NULL},
        (const char *[]){"A\xc3\xa9\xf0\x9f\x98\x80\t\"\\-\n", "Ae\xf0\x9f\x98\x80\t\"\\-x", NULL});
    /* classes over code points: a range of 3-byte characters, '.' is one code point */
    check("classes", "root ::= [\xe3\x81\x81-\xe3\x82\x9f]+ . [a-c-]",
          (const char *[]){"\xe3\x81\x82\xe3\x82\x93\xc3\xa9-", "\xe3\x81\x81xa", NULL},
          (const char *[]){"\xe3\x81\x82\xc3\xa9\xc3\xa9-", "\xe3\x83\xbbxa", "\xe3\x81\x82xd",
                           "\xe3\x81\x82\xc3x-", NULL});
    /* repeats: * + ? {m} {m,} {m,n} on characters, literals and groups */
    check("repeats", "root ::= \"ab\"{2} [0-9]{1,3} (\"x\" | \"yz\"){2,} \"!\"? \"-\"*",
          (const char *[]){"abab1xx", "abab123xyzx!--", NULL},
          (const char *[]){"ab1xx", "abab1234xx", "abab1x", "abab1xx!!", NULL});
    check("repeat-zero", "root ::= \"a\"{0} \"b\"{0,} \"c\"{ 1 , 2 }",
          (const char *[]){"c", "bbcc", NULL}, (const char *[]){"ac", "ccc", NULL});
}

Test(constrain_gbnf, recursion_nested_and_deep)
{
    /* balanced parentheses: a stack, not a regular language */
    check("parens", "root ::= p\np ::= \"(\" p* \")\"", (const char *[]){"()", "(()(()))", NULL},
          (const char *[]){"(()", "())", ")(", NULL});
    /* right recursion in tail position does not grow the stack: 20000 items */
    cst_vocab *v = byte_vocab();
    cst_grammar *g = gbnf("root ::= item root | \"\"\nitem ::= \"a\" | \"b\"");
    size_t n = 20000;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < n; i++) text[i] = i % 3 ? 'a' : 'b';
    text[n] = 0;
    cr_expect(ctu_full_match(g, v, text));
    text[n / 2] = 'c';
    cr_expect(!ctu_full_match(g, v, text));
    free(text);
    cst_grammar_free(g);
    /* a nullable rule before a recursive call is not left recursion */
    g = gbnf("root ::= ws \"[\" (root (\",\" root)*)? \"]\"\nws ::= \" \"*");
    cr_expect(ctu_full_match(g, v, " [[], [ []]]"));
    cr_expect(!ctu_full_match(g, v, "[[],]"));
    cst_grammar_free(g);
    cst_vocab_free(v);
}

Test(constrain_gbnf, masks_agree_with_accept)
{
    cst_vocab *v = byte_vocab();
    cst_grammar *g = gbnf(examples[5].src); /* json.gbnf */
    const char *path = "{\"a\": [1, \"\xc3\xa9\"], \"b\": {}}";
    size_t words = cst_mask_words(v);
    uint32_t *mask = calloc(words, sizeof *mask);
    cst_matcher *m;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    for (size_t at = 0; at <= strlen(path); at++) {
        cr_assert_eq(cst_matcher_mask(m, mask), 0);
        for (int t = 0; t < N_TOK; t++) {
            cst_matcher *probe;
            cr_assert_eq(cst_matcher_create(g, v, &probe), 0);
            cr_assert_eq(cst_matcher_feed(probe, path, at), 0);
            bool ok = cst_matcher_accept(probe, t) == 0;
            cr_assert_eq((bool)(mask[t >> 5] >> (t & 31) & 1), ok, "after %zu bytes: token %d", at,
                         t);
            cst_matcher_free(probe);
        }
        cr_assert_eq((bool)(mask[0] & 1), cst_matcher_can_end(m), "end token after %zu", at);
        if (path[at]) cr_assert_eq(cst_matcher_feed(m, path + at, 1), 0);
    }
    cst_matcher_free(m);
    free(mask);
    cst_grammar_free(g);
    cst_vocab_free(v);
}

/* -EINVAL, no grammar, and a reason that contains each of the words given */
static void bad(const char *src, const char *w1, const char *w2)
{
    cst_grammar *g = (cst_grammar *)1;
    char err[512] = "";
    int rc = cst_compile_gbnf(src, strlen(src), &g, err, sizeof err);
    cr_expect_eq(rc, -EINVAL, "%s: %d (%s)", src, rc, err);
    cr_expect_null(g, "%s: no grammar on error", src);
    cr_expect(strstr(err, w1) != NULL, "%s: the reason says '%s': %s", src, w1, err);
    if (w2) cr_expect(strstr(err, w2) != NULL, "%s: the reason says '%s': %s", src, w2, err);
}

Test(constrain_gbnf, bad_grammars_name_the_line_and_the_rule)
{
    bad("root ::= item\n\nitem ::= \"a\" itme\n", "undefined rule 'itme'", "line 3");
    bad("start ::= \"a\"\n", "no rule named 'root'", NULL);
    bad("", "no rules", NULL);
    bad("root ::= \"a\"\nx ::= \"\\q\"\n", "unknown escape '\\q'", "line 2: rule 'x'");
    bad("root ::= \"\\u00g0\"", "bad escape", "rule 'root'");
    bad("root ::= \"a\"\nb ::= \"abc\n", "unterminated string literal", "rule 'b'");
    bad("root ::= [a-z", "unterminated character class", "line 1");
    bad("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]", "left recursion",
        "rule 'expr'");
    bad("root ::= a\na ::= b \"x\" | \"y\"\nb ::= ws a\nws ::= \" \"*", "left recursion", "line 2");
    bad("root ::= \"a\" root", "no finite text", "rule 'root'");
    bad("root ::= \"a\"\nroot ::= \"b\"", "defined twice", "line 2");
    bad("root ::= <think> \"a\"", "token references", NULL);
    bad("root ::= \"a\"\n  \"b\"", "line 2", "expecting a rule name");
    bad("root ::= (\"a\"", "expecting ')'", NULL);
    bad("root ::= \"a\")", "unmatched ')'", NULL);
    bad("root ::= * \"a\"", "nothing before it to repeat", NULL);
    bad("root ::= \"a\"{3,2}", "maximum is below", NULL);
    bad("root ::= \"a\"{99999}", "above 65535", NULL);
    bad("root ::= []", "empty character class", NULL);
    bad("root ::= [z-a]", "reversed range", NULL);
    bad("root = \"a\"", "expecting '::='", NULL);
    bad("root ::= \"\xff\"", "invalid UTF-8", NULL);
    static const char nul[] = "root ::= \"a\0\"";
    cst_grammar *g;
    char err[256];
    cr_expect_eq(cst_compile_gbnf(nul, sizeof nul - 1, &g, err, sizeof err), -EINVAL);
}

Test(constrain_gbnf, oversized_is_refused_not_built)
{
    /* llama.cpp's own refusal case: nested repeats of a nullable group */
    const char *src = "root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}";
    cst_grammar *g;
    char err[256];
    cr_assert_eq(cst_compile_gbnf(src, strlen(src), &g, err, sizeof err), -E2BIG, "%s", err);
    cr_expect(strstr(err, "too large") != NULL, "%s", err);
    cr_expect_eq(cst_compile_gbnf(src, CST_MAX_SOURCE_BYTES + 1, &g, err, sizeof err), -E2BIG);
}

/* A small grammar that is costly to analyse (6,000 chained rules, 150 KB: hours of analysis
 * before the bound) is refused by a step bound, not a clock: the same answer on any machine
 * under any load. A grammar of 1,000 such rules still compiles and matches. */
Test(constrain_gbnf, a_grammar_too_costly_to_analyse_is_refused_by_a_step_bound, .timeout = 60)
{
    size_t len;
    char *src = ctu_rule_chain(6000, &len);
    cst_grammar *g = NULL;
    char err[512];
    cr_assert_eq(cst_compile_gbnf(src, len, &g, err, sizeof err), -E2BIG, "%s", err);
    cr_expect(g == NULL);
    cr_expect(strstr(err, "too costly to analyse") != NULL, "%s", err);
    cr_expect(strstr(err, "6001 rules") != NULL, "%s", err);
    free(src);
    src = ctu_rule_chain(1000, &len);
    cr_assert_eq(cst_compile_gbnf(src, len, &g, err, sizeof err), 0, "%s", err);
    cst_vocab *v = byte_vocab();
    char text[2100];
    memset(text, 'a', 999);
    text[999] = 'c';
    memset(text + 1000, 'b', 999);
    text[1999] = 0;
    cr_expect(ctu_full_match(g, v, text));
    text[1998] = 0;
    cr_expect(!ctu_full_match(g, v, text));
    cst_grammar_free(g);
    cst_vocab_free(v);
    free(src);
}
