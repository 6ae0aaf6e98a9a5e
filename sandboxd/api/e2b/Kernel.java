// A Java code context of an E2B sandbox: one JVM per context running JShell in-process (its snippets share the
// kernel's JVM, as IJava's do), started by the code interpreter's in-sandbox driver (kernels.py) with the source
// launcher. One cell per stdin line: "<marker> <base64 code> <base64 envs, one NAME=value per line>". What a
// cell prints goes to stdout and stderr as it runs; then the marker to both; then its answer as one JSON line
// ({"text": ...} or {"error": {...}}) on the file descriptor named in args[0]. The sandbox's environment, and a
// cell's envs for that cell, are system properties (System.getProperty), as E2B's Java kernel gives them.
import java.io.BufferedReader;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;

public class Kernel {
    public static void main(String[] args) throws Exception {
        PrintStream answers = new PrintStream(new FileOutputStream("/proc/self/fd/" + args[0]), true, StandardCharsets.UTF_8);
        System.getenv().forEach(System::setProperty);
        JShell shell = JShell.builder().executionEngine("local").out(System.out).err(System.err).build();
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        Base64.Decoder b64 = Base64.getDecoder();
        for (String line; (line = in.readLine()) != null; ) {
            String[] parts = line.split(" ", -1);
            String marker = parts[0];
            String code = new String(b64.decode(parts[1]), StandardCharsets.UTF_8);
            Map<String, String> saved = new HashMap<>();
            for (String pair : new String(b64.decode(parts[2]), StandardCharsets.UTF_8).split("\n")) {
                int eq = pair.indexOf('=');
                if (eq > 0) {
                    String name = pair.substring(0, eq);
                    saved.put(name, System.getProperty(name));
                    System.setProperty(name, pair.substring(eq + 1));
                }
            }
            String answer;
            try {
                answer = run(shell, analysis, code);
            } catch (Throwable t) {
                answer = error(t.getClass().getSimpleName(), String.valueOf(t.getMessage()), "");
            }
            saved.forEach((k, v) -> {
                if (v == null) System.clearProperty(k);
                else System.setProperty(k, v);
            });
            System.out.flush();
            System.err.flush();
            System.out.print("\u001e" + marker + "\n");
            System.err.print("\u001e" + marker + "\n");
            System.out.flush();
            System.err.flush();
            answers.println("{\"marker\": " + json(marker) + ", " + answer.substring(1));
        }
    }

    static String run(JShell shell, SourceCodeAnalysis analysis, String code) {
        String text = null;
        String remaining = code;
        while (!remaining.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(remaining);
            if (!info.completeness().isComplete()) {
                return error("CompilationException", "incomplete input: " + remaining.strip(), "");
            }
            remaining = info.remaining();
            for (SnippetEvent event : shell.eval(info.source())) {
                if (event.status() == Snippet.Status.REJECTED) {
                    String why = shell.diagnostics(event.snippet())
                        .map(d -> d.getMessage(null)).collect(Collectors.joining("\n"));
                    return error("CompilationException", why, event.snippet().source());
                }
                if (event.exception() != null) {
                    Throwable t = event.exception();
                    String name = t instanceof EvalException e ? e.getExceptionClassName() : t.getClass().getName();
                    return error(name, String.valueOf(t.getMessage()), name + ": " + t.getMessage());
                }
                Snippet snippet = event.snippet();
                boolean expression = snippet.kind() == Snippet.Kind.EXPRESSION
                    || snippet.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND;
                if (event.causeSnippet() == null && event.value() != null && expression) {
                    text = shown(event.value());
                }
            }
        }
        return text == null ? "{\"text\": null}" : "{\"text\": " + json(text) + "}";
    }

    static String shown(String value) {
        // JShell shows a String value quoted and escaped; a notebook shows the string itself
        if (value.length() >= 2 && value.startsWith("\"") && value.endsWith("\"")) {
            return value.substring(1, value.length() - 1).replace("\\\"", "\"").replace("\\n", "\n").replace("\\\\", "\\");
        }
        return value;
    }

    static String error(String name, String value, String traceback) {
        return "{\"error\": {\"name\": " + json(name) + ", \"value\": " + json(value) + ", \"traceback\": " + json(traceback) + "}}";
    }

    static String json(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') out.append('\\').append(c);
            else if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
            else out.append(c);
        }
        return out.append('"').toString();
    }
}
