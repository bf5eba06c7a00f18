"""The front end: source text -> AST -> IR. The grammar (schedc/grammars/sched.lark, loaded by parse), the AST,
expressions, elaboration with its order strategies (order: queues and programs, greedy, explicit), user
tasks, and the library of shipped schedules."""
